#pragma once
// `kiln perplexity --kl-divergence-base FILE [--kl-divergence]`: the reference model's
// distributions saved once, then compared with another model's (a quantized copy) token
// by token, with the statistics llama-perplexity prints.
//
// Base file format (kiln's own, little-endian; llama.cpp's `_logits_` files are not read):
//
//   offset  bytes          field
//   0       8              magic "kilnkld" followed by a NUL byte
//   8       4              uint32 version (1)
//   12      4              uint32 n_vocab
//   16      4              uint32 n_ctx      (tokens per chunk)
//   20      4              uint32 n_chunk
//   24      4              uint32 first      (first scored position of a chunk)
//   28      4*n_ctx*n_chunk int32 tokens     (as tokenized; BOS is put at position 0 of
//                                              each chunk at run time, as when scoring)
//   then, chunk by chunk, one row per scored position j in [first, n_ctx - 1):
//           4              float lp_floor    log-probability that code 0 stands for
//           4              float step        log-probability per code unit
//           4              float lp_target   exact log-probability of token j + 1
//           4              int32 top         the reference's argmax (first of equals)
//           2*n_vocab      uint16 code[i]    log p[i] ~= lp_floor + step * code[i]
//
// The codes span at most kRange nats below the most likely token (lower ones are
// clamped to the floor: they weigh < e^-32 each), so one step is at most ~5e-4 nats.
// Readers renormalize the decoded distribution, which keeps the quantization error of a
// KL divergence second-order (~1e-8): a model scored against its own file gives 0.
#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

namespace kiln::cli::kld {

inline constexpr float kRange = 32.0f;

struct Header {
  uint32_t n_vocab = 0, n_ctx = 0, n_chunk = 0, first = 0;
  uint32_t rows_per_chunk() const { return n_ctx - 1 - first; }
};

// Writes a base file as perplexity goes; throws kiln::Error naming the file.
class BaseWriter {
 public:
  BaseWriter(const std::string& path, const Header& header, std::span<const int32_t> tokens);
  ~BaseWriter();
  BaseWriter(const BaseWriter&) = delete;
  BaseWriter& operator=(const BaseWriter&) = delete;
  // One scored position: the reference's logits (n_vocab) and the token that follows.
  void add(const float* logits, int32_t target);
  // Flushes and closes; a row count other than the header's is an error.
  void finish();

 private:
  std::string path_;
  Header header_;
  std::FILE* f_ = nullptr;
  uint64_t rows_ = 0;
  std::vector<uint16_t> codes_;
};

struct Row {
  float lp_floor = 0, step = 0, lp_target = 0;
  int32_t top = 0;
  const uint16_t* codes = nullptr;
};

// Reads and validates a base file (magic, version, size against the header).
class BaseReader {
 public:
  explicit BaseReader(const std::string& path);
  ~BaseReader();
  BaseReader(const BaseReader&) = delete;
  BaseReader& operator=(const BaseReader&) = delete;
  const std::string& path() const { return path_; }
  const Header& header() const { return header_; }
  const std::vector<int32_t>& tokens() const { return tokens_; }
  // The next row; the codes stay valid until the following call.
  Row next();

 private:
  std::string path_;
  Header header_;
  std::FILE* f_ = nullptr;
  std::vector<int32_t> tokens_;
  std::vector<uint8_t> row_;
};

// Running sums over scored tokens of the compared model against the base.
class Stats {
 public:
  // logits: the compared model's row for this position; target: the next token.
  void add(const Row& base, std::span<const float> logits, int32_t target);
  size_t count() const { return kld_.size(); }
  // One line of the per-chunk table (like llama-perplexity's), and its header.
  static std::string table_header();
  std::string table_line(int chunk) const;
  // The closing statistics block (perplexities, KLD distribution, token probabilities).
  std::string summary() const;

 private:
  double sum_nll_ = 0, sum_nll2_ = 0, sum_nll_base_ = 0, sum_nll_base2_ = 0, sum_nll_nll_base_ = 0;
  double sum_kld_ = 0, sum_kld2_ = 0, sum_dp_ = 0, sum_dp2_ = 0, sum_dp4_ = 0;
  size_t same_top_ = 0;
  std::vector<float> kld_, dp_;
  std::vector<double> base_p_;  // scratch: the decoded base row, unnormalized
};

}  // namespace kiln::cli::kld
