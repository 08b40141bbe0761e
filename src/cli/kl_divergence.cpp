#include "cli/kl_divergence.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "kiln/error.h"

namespace kiln::cli::kld {
namespace {

constexpr char kMagic[8] = {'k', 'i', 'l', 'n', 'k', 'l', 'd', '\0'};
constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderBytes = 28;
constexpr size_t kRowHeadBytes = 16;

size_t row_bytes(const Header& h) { return kRowHeadBytes + 2 * size_t(h.n_vocab); }

struct MaxLse {
  float max;
  double lse;  // log sum exp(logit - max)
  int32_t argmax;
};
MaxLse max_lse(std::span<const float> logits) {
  MaxLse r{logits[0], 0.0, 0};
  for (size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > r.max) r.max = logits[i], r.argmax = (int32_t)i;
  double sum = 0;
  for (float v : logits) sum += std::exp(double(v) - r.max);
  r.lse = std::log(sum);
  return r;
}

// llama-perplexity's estimate: the mean, and the standard error of the mean.
std::pair<double, double> mean_and_error(double sum, double sum2, size_t n) {
  if (n == 0) return {0.0, 0.0};
  const double mean = sum / double(n);
  const double var = sum2 / double(n) - mean * mean;
  return {mean, var > 0 && n > 1 ? std::sqrt(var / double(n - 1)) : 0.0};
}

double covariance(double sum_a, double sum_b, double sum_ab, size_t n) {
  if (n < 2) return 0.0;
  return (sum_ab / double(n) - (sum_a / double(n)) * (sum_b / double(n))) / double(n - 1);
}

// Linear interpolation between the closest ranks of sorted values.
double percentile(const std::vector<float>& sorted, double fraction) {
  if (sorted.empty()) return 0.0;
  const double p = fraction * double(sorted.size() - 1);
  const size_t i = size_t(p);
  const double t = p - double(i);
  return (1 - t) * sorted[i] + t * sorted[std::min(i + 1, sorted.size() - 1)];
}

std::string format(const char* fmt, auto... args) {
  char buf[256];
  std::snprintf(buf, sizeof buf, fmt, args...);
  return buf;
}

void put_u32(uint8_t* p, uint32_t v) { std::memcpy(p, &v, 4); }
uint32_t get_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

}  // namespace

BaseWriter::BaseWriter(const std::string& path, const Header& header, std::span<const int32_t> tokens)
    : path_(path), header_(header), codes_(header.n_vocab) {
  if (tokens.size() != size_t(header.n_ctx) * header.n_chunk)
    throw Error(path + ": " + std::to_string(tokens.size()) + " tokens do not make " +
                std::to_string(header.n_chunk) + " chunks of " + std::to_string(header.n_ctx));
  f_ = std::fopen(path.c_str(), "wb");
  if (!f_) throw Error(path + ": cannot write: " + std::strerror(errno));
  uint8_t head[kHeaderBytes];
  std::memcpy(head, kMagic, 8);
  put_u32(head + 8, kVersion);
  put_u32(head + 12, header.n_vocab);
  put_u32(head + 16, header.n_ctx);
  put_u32(head + 20, header.n_chunk);
  put_u32(head + 24, header.first);
  if (std::fwrite(head, 1, sizeof head, f_) != sizeof head ||
      std::fwrite(tokens.data(), sizeof(int32_t), tokens.size(), f_) != tokens.size())
    throw Error(path_ + ": write failed: " + std::strerror(errno));
}

BaseWriter::~BaseWriter() {
  if (f_) std::fclose(f_);
}

void BaseWriter::add(const float* logits, int32_t target) {
  const size_t n = header_.n_vocab;
  const MaxLse m = max_lse({logits, n});
  float lo = logits[0];
  for (size_t i = 1; i < n; ++i) lo = std::min(lo, logits[i]);
  const float floor = std::max(lo, m.max - kRange);
  const float step = (m.max - floor) / 65535.0f;
  for (size_t i = 0; i < n; ++i) {
    const float c = step > 0 ? std::round((logits[i] - floor) / step) : 0.0f;
    codes_[i] = (uint16_t)std::clamp(c, 0.0f, 65535.0f);
  }
  const float head[3] = {float(double(floor) - m.max - m.lse), step, float(double(logits[target]) - m.max - m.lse)};
  uint8_t bytes[kRowHeadBytes];
  std::memcpy(bytes, head, 12);
  std::memcpy(bytes + 12, &m.argmax, 4);
  if (std::fwrite(bytes, 1, sizeof bytes, f_) != sizeof bytes || std::fwrite(codes_.data(), 2, n, f_) != n)
    throw Error(path_ + ": write failed: " + std::strerror(errno));
  ++rows_;
}

void BaseWriter::finish() {
  const uint64_t want = uint64_t(header_.n_chunk) * header_.rows_per_chunk();
  if (rows_ != want)
    throw Error(path_ + ": " + std::to_string(rows_) + " rows written, the header promises " + std::to_string(want));
  const int rc = std::fclose(f_);
  f_ = nullptr;
  if (rc != 0) throw Error(path_ + ": write failed: " + std::strerror(errno));
}

BaseReader::BaseReader(const std::string& path) : path_(path) {
  f_ = std::fopen(path.c_str(), "rb");
  if (!f_) throw Error(path + ": cannot open: " + std::strerror(errno));
  uint8_t head[kHeaderBytes];
  if (std::fread(head, 1, sizeof head, f_) != sizeof head)
    throw Error(path + ": too short for a kiln KL-divergence base file");
  if (std::memcmp(head, "_logits_", 8) == 0)
    throw Error(path + ": a llama.cpp logits file; kiln reads its own (make one with kiln perplexity "
                       "--kl-divergence-base on the reference model)");
  if (std::memcmp(head, kMagic, 8) != 0)
    throw Error(path + ": not a kiln KL-divergence base file (bad magic)");
  if (get_u32(head + 8) != kVersion)
    throw Error(path + ": base file version " + std::to_string(get_u32(head + 8)) + ", this kiln reads version " +
                std::to_string(kVersion));
  header_ = {get_u32(head + 12), get_u32(head + 16), get_u32(head + 20), get_u32(head + 24)};
  const Header& h = header_;
  if (h.n_vocab == 0 || h.n_ctx < 4 || h.n_chunk == 0 || h.first >= h.n_ctx - 1 || h.n_vocab > (1u << 24) ||
      h.n_ctx > (1u << 24))
    throw Error(path + ": corrupt header (vocabulary " + std::to_string(h.n_vocab) + ", context " +
                std::to_string(h.n_ctx) + ", chunks " + std::to_string(h.n_chunk) + ")");
  const uint64_t n_tokens = uint64_t(h.n_ctx) * h.n_chunk;
  const uint64_t want = kHeaderBytes + 4 * n_tokens + uint64_t(h.n_chunk) * h.rows_per_chunk() * row_bytes(h);
  std::error_code ec;
  const uint64_t have = std::filesystem::file_size(path, ec);
  if (ec || have != want)
    throw Error(path + ": " + std::to_string(have) + " bytes, but its header (vocabulary " + std::to_string(h.n_vocab) +
                ", " + std::to_string(h.n_chunk) + " chunks of " + std::to_string(h.n_ctx) + ") needs " +
                std::to_string(want) + " (truncated or corrupt)");
  tokens_.resize(n_tokens);
  if (std::fread(tokens_.data(), 4, n_tokens, f_) != n_tokens) throw Error(path + ": read failed");
  for (int32_t t : tokens_)
    if (t < 0 || uint32_t(t) >= h.n_vocab) throw Error(path + ": token id " + std::to_string(t) + " out of range");
  row_.resize(row_bytes(h));
}

BaseReader::~BaseReader() {
  if (f_) std::fclose(f_);
}

Row BaseReader::next() {
  if (std::fread(row_.data(), 1, row_.size(), f_) != row_.size()) throw Error(path_ + ": read failed");
  Row r;
  std::memcpy(&r.lp_floor, row_.data(), 4);
  std::memcpy(&r.step, row_.data() + 4, 4);
  std::memcpy(&r.lp_target, row_.data() + 8, 4);
  std::memcpy(&r.top, row_.data() + 12, 4);
  if (r.top < 0 || uint32_t(r.top) >= header_.n_vocab || !std::isfinite(r.step) || !std::isfinite(r.lp_floor))
    throw Error(path_ + ": corrupt row");
  // The codes sit at offset 16 of a vector<uint8_t>, whose storage is suitably aligned.
  r.codes = reinterpret_cast<const uint16_t*>(row_.data() + kRowHeadBytes);
  return r;
}

void Stats::add(const Row& base, std::span<const float> logits, int32_t target) {
  const size_t n = logits.size();
  const MaxLse q = max_lse(logits);

  // The decoded base distribution, renormalized (see the header comment): log p[i] is
  // step * code[i] - log sum_j exp(step * code[j]), the floor cancelling out.
  base_p_.resize(n);
  uint16_t top = 0;
  for (size_t i = 0; i < n; ++i) top = std::max(top, base.codes[i]);
  double sum = 0;
  for (size_t i = 0; i < n; ++i) sum += base_p_[i] = std::exp(double(base.step) * (int(base.codes[i]) - int(top)));
  const double log_sum = std::log(sum);
  double kld = 0;
  for (size_t i = 0; i < n; ++i) {
    const double lp = double(base.step) * (int(base.codes[i]) - int(top)) - log_sum;
    const double lq = double(logits[i]) - q.max - q.lse;
    kld += base_p_[i] / sum * (lp - lq);
  }

  const double nll = -(double(logits[target]) - q.max - q.lse);
  const double nll_base = -double(base.lp_target);
  sum_nll_ += nll;
  sum_nll2_ += nll * nll;
  sum_nll_base_ += nll_base;
  sum_nll_base2_ += nll_base * nll_base;
  sum_nll_nll_base_ += nll * nll_base;
  sum_kld_ += kld;
  sum_kld2_ += kld * kld;
  const double dp = std::exp(-nll) - std::exp(-nll_base);
  sum_dp_ += dp;
  sum_dp2_ += dp * dp;
  sum_dp4_ += dp * dp * dp * dp;
  same_top_ += q.argmax == base.top;
  kld_.push_back((float)kld);
  dp_.push_back((float)dp);
}

std::string Stats::table_header() {
  return "chunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence              Δp RMS"
         "            Same top p";
}

std::string Stats::table_line(int chunk) const {
  const size_t n = count();
  const auto lq = mean_and_error(sum_nll_, sum_nll2_, n), lb = mean_and_error(sum_nll_base_, sum_nll_base2_, n);
  const double cov = covariance(sum_nll_, sum_nll_base_, sum_nll_nll_base_, n);
  const double ratio_err = std::sqrt(std::max(0.0, lq.second * lq.second + lb.second * lb.second - 2 * cov));
  const auto k = mean_and_error(sum_kld_, sum_kld2_, n);
  const auto mse = mean_and_error(sum_dp2_, sum_dp4_, n);
  const double rms = std::sqrt(mse.first), rms_err = rms > 0 ? 0.5 / rms * mse.second : 0.0;
  const double top = n ? double(same_top_) / double(n) : 0.0;
  const double top_err = n > 1 ? std::sqrt(top * (1 - top) / double(n - 1)) : 0.0;
  const double ppl = std::exp(lq.first);
  return format("%4d    %9.4f ± %9.4f    %10.5f ± %10.5f    %10.5f ± %10.5f    %6.3f ± %6.3f %%    %6.3f ± %6.3f %%",
                chunk, ppl, ppl * lq.second, lq.first - lb.first, ratio_err, k.first, k.second, 100 * rms,
                100 * rms_err, 100 * top, 100 * top_err);
}

std::string Stats::summary() const {
  const size_t n = count();
  std::string s;
  const auto line = [&s](const std::string& l) { s += l + "\n"; };
  const auto lq = mean_and_error(sum_nll_, sum_nll2_, n), lb = mean_and_error(sum_nll_base_, sum_nll_base2_, n);
  const double ppl = std::exp(lq.first), ppl_err = ppl * lq.second;
  const double base = std::exp(lb.first), base_err = base * lb.second;
  const double cov = covariance(sum_nll_, sum_nll_base_, sum_nll_nll_base_, n);
  const double cor = lq.second > 0 && lb.second > 0 ? cov / (lq.second * lb.second) : 1.0;
  const double ratio = lq.first - lb.first;
  const double ratio_err = std::sqrt(std::max(0.0, lq.second * lq.second + lb.second * lb.second - 2 * cov));
  const double diff_err =
      std::sqrt(std::max(0.0, ppl_err * ppl_err + base_err * base_err - 2 * ppl * base * cov));
  line("====== Perplexity statistics ======");
  line(format("Mean PPL(Q)                   : %10.6f ± %10.6f", ppl, ppl_err));
  line(format("Mean PPL(base)                : %10.6f ± %10.6f", base, base_err));
  line(format("Cor(ln(PPL(Q)), ln(PPL(base))): %6.2f%%", 100 * cor));
  line(format("Mean ln(PPL(Q)/PPL(base))     : %10.6f ± %10.6f", ratio, ratio_err));
  line(format("Mean PPL(Q)/PPL(base)         : %10.6f ± %10.6f", std::exp(ratio), std::exp(ratio) * ratio_err));
  line(format("Mean PPL(Q)-PPL(base)         : %10.6f ± %10.6f", ppl - base, diff_err));
  line("");

  std::vector<float> kld = kld_, dp = dp_;
  std::sort(kld.begin(), kld.end());
  std::sort(dp.begin(), dp.end());
  const auto k = mean_and_error(sum_kld_, sum_kld2_, n);
  line("====== KL divergence statistics ======");
  line(format("Mean    KLD: %10.6f ± %10.6f", k.first, k.second));
  line(format("Maximum KLD: %10.6f", kld.empty() ? 0.0 : kld.back()));
  for (double f : {0.999, 0.99, 0.95, 0.90})
    line(format("%4.1f%%   KLD: %10.6f", 100 * f, percentile(kld, f)));
  line(format("Median  KLD: %10.6f", percentile(kld, 0.5)));
  for (double f : {0.10, 0.05, 0.01, 0.001})
    line(format("%4.1f%%   KLD: %10.6f", 100 * f, percentile(kld, f)));
  line(format("Minimum KLD: %10.6f", kld.empty() ? 0.0 : kld.front()));
  line("");

  const auto d = mean_and_error(sum_dp_, sum_dp2_, n);
  const auto mse = mean_and_error(sum_dp2_, sum_dp4_, n);
  const double rms = std::sqrt(mse.first), rms_err = rms > 0 ? 0.5 / rms * mse.second : 0.0;
  const double top = n ? double(same_top_) / double(n) : 0.0;
  const double top_err = n > 1 ? std::sqrt(top * (1 - top) / double(n - 1)) : 0.0;
  line("====== Token probability statistics ======");
  line(format("Mean    Δp: %6.3f ± %5.3f %%", 100 * d.first, 100 * d.second));
  line(format("Maximum Δp: %6.3f%%", dp.empty() ? 0.0 : 100 * dp.back()));
  for (double f : {0.999, 0.99, 0.95, 0.90, 0.75})
    line(format("%4.1f%%   Δp: %6.3f%%", 100 * f, 100 * percentile(dp, f)));
  line(format("Median  Δp: %6.3f%%", 100 * percentile(dp, 0.5)));
  for (double f : {0.25, 0.10, 0.05, 0.01, 0.001})
    line(format("%4.1f%%   Δp: %6.3f%%", 100 * f, 100 * percentile(dp, f)));
  line(format("Minimum Δp: %6.3f%%", dp.empty() ? 0.0 : 100 * dp.front()));
  line(format("RMS Δp    : %6.3f ± %5.3f %%", 100 * rms, 100 * rms_err));
  line(format("Same top p: %6.3f ± %5.3f %%", 100 * top, 100 * top_err));
  return s;
}

}  // namespace kiln::cli::kld
