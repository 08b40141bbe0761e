// The fallback chat templates kiln offers for GGUFs without one (`--chat-template NAME`).
// Each is the Jinja2 text of tests/data/templates/builtin-<name>.jinja, which the tests
// check is the same text, and whose expected renderings Jinja2 itself made.
#include <string_view>

#include "kiln/chat_template.h"

namespace kiln {
namespace {

struct Builtin {
  const char* name;
  const char* source;
};

// ChatML (<|im_start|>role ... <|im_end|>): Qwen, Hermes, many fine-tunes.
constexpr const char* k_chatml = R"jinja({%- for message in messages %}
    {{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
)jinja";

// Llama 2 chat, exactly Meta's template: [INST] turns, <<SYS>> inside the first one, BOS before each.
constexpr const char* k_llama2 = R"jinja({% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\n' + system_message + '\n<</SYS>>\n\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}
)jinja";

// Llama 3 Instruct, exactly Meta's template: header ids around each role, <|eot_id|> after each turn.
constexpr const char* k_llama3 = R"jinja({% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}
)jinja";

// Mistral Instruct v0.1's [INST] format; a system message goes before the first user message, as
// later Mistral templates put it.
constexpr const char* k_mistral = R"jinja({%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{{- bos_token }}
{%- for message in loop_messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif %}
    {%- if message['role'] == 'user' %}
        {%- if loop.first and system_message is defined %}
            {{- '[INST] ' + system_message + '\n\n' + message['content'] + ' [/INST]' }}
        {%- else %}
            {{- '[INST] ' + message['content'] + ' [/INST]' }}
        {%- endif %}
    {%- elif message['role'] == 'assistant' %}
        {{- message['content'] + eos_token }}
    {%- else %}
        {{- raise_exception('Only user and assistant roles are supported, with the exception of an initial optional system message!') }}
    {%- endif %}
{%- endfor %}
)jinja";

// Gemma 2/3's <start_of_turn> format; a system message goes before the first user message, as
// Gemma 3's template does (Gemma 2's refuses it).
constexpr const char* k_gemma = R"jinja({{- bos_token }}
{%- if messages[0]['role'] == 'system' %}
    {%- set first_user_prefix = messages[0]['content'] + '\n\n' %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set first_user_prefix = '' %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- for message in loop_messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif %}
    {%- set role = 'model' if message['role'] == 'assistant' else message['role'] %}
    {{- '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') + message['content'] | trim + '<end_of_turn>\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<start_of_turn>model\n' }}
{%- endif %}
)jinja";

// Phi-3 / Phi-3.5 mini's <|user|> ... <|end|> format: renders what Phi-3.5-mini-instruct's
// template renders.
constexpr const char* k_phi3 = R"jinja({%- for message in messages %}
    {%- if message['role'] == 'system' and message['content'] %}
        {{- '<|system|>\n' + message['content'] + '<|end|>\n' }}
    {%- elif message['role'] == 'user' %}
        {{- '<|user|>\n' + message['content'] + '<|end|>\n' }}
    {%- elif message['role'] == 'assistant' %}
        {{- '<|assistant|>\n' + message['content'] + '<|end|>\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|assistant|>\n' }}
{%- else %}
    {{- eos_token }}
{%- endif %}
)jinja";

// Zephyr, exactly HuggingFaceH4/zephyr-7b-beta's template (TinyLlama chat uses it too).
constexpr const char* k_zephyr = R"jinja({% for message in messages %}
{% if message['role'] == 'user' %}
{{ '<|user|>
' + message['content'] + eos_token }}
{% elif message['role'] == 'system' %}
{{ '<|system|>
' + message['content'] + eos_token }}
{% elif message['role'] == 'assistant' %}
{{ '<|assistant|>
'  + message['content'] + eos_token }}
{% endif %}
{% if loop.last and add_generation_prompt %}
{{ '<|assistant|>' }}
{% endif %}
{% endfor %}
)jinja";

constexpr Builtin kBuiltins[] = {
    {"chatml", k_chatml},
    {"llama2", k_llama2},
    {"llama3", k_llama3},
    {"mistral", k_mistral},
    {"gemma", k_gemma},
    {"phi3", k_phi3},
    {"zephyr", k_zephyr},
};

}  // namespace

const char* builtin_chat_template(std::string_view name) {
  for (const Builtin& b : kBuiltins)
    if (name == b.name) return b.source;
  return nullptr;
}

std::vector<std::string> builtin_chat_template_names() {
  std::vector<std::string> names;
  for (const Builtin& b : kBuiltins) names.emplace_back(b.name);
  return names;
}

}  // namespace kiln
