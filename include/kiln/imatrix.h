#pragma once
// Importance matrices in llama.cpp's file formats: what `kiln imatrix` collects and
// `kiln quantize --imatrix` weighs the quantization error by, interchangeable with
// llama-imatrix's and llama-quantize's files.
//
// For every weight matrix W that multiplies activations, the statistics are, per input
// column j, the sum over the rows x that went into W of x_j^2, and how many rows that
// was. A 3-D tensor of experts keeps one such vector and count per expert (each over the
// tokens routed to it). Their quotient, the mean squared activation of column j, says
// how much an error in W's column j costs the output: what a quantizer weighs it by.
//
// GGUF (llama-imatrix's default): general.type "imatrix"; imatrix.datasets (the texts,
// array of strings), imatrix.chunk_count and imatrix.chunk_size (u32); per weight
// "<name>.in_sum2" F32 [n_per_row, n_mat] (the sums, expert-major) and "<name>.counts"
// F32 [1, n_mat], tensors ordered by name.
//
// Legacy .dat (llama-imatrix --output-format dat), little-endian: int32 n_entries; per
// entry int32 name length, the name, int32 ncall, int32 n_values, n_values floats holding
// sum / count * ncall (ncall: the chunks the entry's largest count spans); then,
// optionally, int32 chunk count, int32 length and the dataset's name.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace kiln::imatrix {

// One weight tensor's statistics: n_mat() matrices (a 3-D tensor's experts, else one).
struct Entry {
  std::vector<float> sums;      // [n_mat][n_per_row]: sum of x_j^2 (legacy: see above)
  std::vector<int64_t> counts;  // [n_mat]: rows summed (legacy: {ncall})
  size_t n_mat() const { return counts.size(); }
  size_t n_per_row() const { return counts.empty() ? 0 : sums.size() / counts.size(); }
};

struct Imatrix {
  std::map<std::string, Entry> entries;  // by weight tensor name
  std::vector<std::string> datasets;     // the texts it was collected on
  int32_t chunk_count = 0;               // chunks evaluated
  int32_t chunk_size = 0;                // tokens per chunk (0 from a legacy file)
  bool legacy = false;                   // read from a .dat file: sums and counts as it stores them
  // A GGUF file's datasets, chunk_count and chunk_size keys were all there
  // (llama-quantize refuses a GGUF imatrix without them).
  bool has_metadata = false;
};

// Reads either format (a file starting with "GGUF" is read as GGUF, anything else as
// .dat). Throws kiln::Error naming the file and the field for a file that is not one: no
// entries, a .in_sum2 without its .counts, a type other than F32, counts that do not
// divide the sums, a negative or non-finite count or sum, a truncated .dat.
Imatrix read(const std::string& path);

// Write llama-imatrix's two formats from collected statistics (not from a legacy
// Imatrix: kiln::Error). GGUF writes every entry, .dat leaves out those with no rows at
// all and stores 1 for an expert without rows, as llama-imatrix does. Throw kiln::Error
// on I/O failure.
void write_gguf(const Imatrix& m, const std::string& path);
void write_dat(const Imatrix& m, const std::string& path);

// The importance vector llama-quantize derives from an entry: [n_mat][n_per_row], each
// matrix's sums divided by its count (1s for an expert no row went to), or for a legacy
// entry the stored values divided by ncall.
std::vector<float> importance(const Entry& e, bool legacy);

}  // namespace kiln::imatrix
