#pragma once
// Moves the weights that decoding streams into one block of anonymous, huge-page-backed memory.
//
// Why: decode reads every projection once per token, so its speed is the speed of that read. On
// the machine we measured, bf16 E4B decode streamed the same bytes at 19-20 GB/s from the file
// mapping (page cache, 4 KiB pages) and 32-33 GB/s from anonymous huge pages (docs/benchmarks.md).
// The bytes are copied verbatim (bf16 stays bf16, quantized blocks stay as they are) with pread,
// so the file mapping never enters this process's RSS; the PLE table, of which decoding gathers a
// single row per token, and the embedding rows used for lookups under tensor parallelism stay
// mapped.
//
// The copy is also where a backend can have quantized matrices rearranged into the layout its
// kernels read fastest (kernels/weight.h, WeightLayout): `choose_layout` is asked per matrix.
#include <cstddef>
#include <memory>

#include "core/thread_pool.h"
#include "io/checkpoint.h"
#include "model/weights.h"

namespace tandem {

class ResidentWeights {
 public:
  using LayoutChooser = WeightLayout (*)(const WeightMatrix&);
  // Copies this rank's streamed matrices and repoints `weights` at the copies, rearranged into
  // choose_layout(matrix) where that is not the plain layout (nullptr: all stay plain).
  static std::unique_ptr<ResidentWeights> load(ModelWeights& weights, const CheckpointFiles& files, ThreadPool& pool,
                                               bool show_progress, LayoutChooser choose_layout = nullptr);
  ~ResidentWeights();
  ResidentWeights(const ResidentWeights&) = delete;
  ResidentWeights& operator=(const ResidentWeights&) = delete;

  size_t bytes() const { return bytes_; }

 private:
  ResidentWeights() = default;
  void* memory_ = nullptr;
  size_t mapped_bytes_ = 0;
  size_t bytes_ = 0;
};

}  // namespace tandem
