// Encodes tests/data/hf_tokenizer/strings.json with each tokenizer.json through
// @huggingface/tokenizers (the transformers.js tokenizer), without special tokens added.
import { Tokenizer } from "@huggingface/tokenizers";
import fs from "fs";
import { fileURLToPath } from "url";
const [stringsPath, outDir] = process.argv.slice(2);
// ../shared next to the repository root (this file is in tests/data/hf_tokenizer/).
const shared = fileURLToPath(new URL("../../../../shared/tokenizers", import.meta.url));
const strings = JSON.parse(fs.readFileSync(stringsPath, "utf8"));
for (const name of ["llama3", "qwen3", "gemma3"]) {
  const dir = `${shared}/${name}-hf`;
  const tj = JSON.parse(fs.readFileSync(`${dir}/tokenizer.json`, "utf8"));
  const tc = JSON.parse(fs.readFileSync(`${dir}/tokenizer_config.json`, "utf8"));
  const tok = new Tokenizer(tj, tc);
  const out = strings.map((s) => {
    const ids = tok.encode(s, { add_special_tokens: false }).ids;
    return { ids: Array.from(ids), decoded: ids.length ? tok.decode(Array.from(ids), { skip_special_tokens: false }) : "" };
  });
  fs.writeFileSync(`${outDir}/${name}.json`, JSON.stringify(out, null, 0).replace(/\},\{/g, "},\n{") + "\n");
}
