#include "model/resident_weights.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "core/error.h"
#include "core/progress.h"

namespace tandem {

namespace {

constexpr size_t kHugePage = size_t(2) << 20;
constexpr size_t kAlign = 64;

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

// Where a pointer into a mapped checkpoint file comes from.
struct FileSpan {
  int fd = -1;
  std::string path;
  const uint8_t* base = nullptr;
  size_t size = 0;
};

// One strided region to copy into a contiguous destination: `rows` rows of `row_bytes`, `stride`
// apart in the file (a column slice under tensor parallelism has stride > row_bytes).
struct CopyJob {
  const FileSpan* file;
  size_t offset;
  size_t rows, row_bytes, stride;
  uint8_t* dest;
  // Float matrices are checked for Inf and NaN as they arrive, naming `tensor` (null: codes and
  // scales, whose scales the loader checked).
  const std::string* tensor = nullptr;
  WeightFormat format = WeightFormat::BF16;
  size_t bytes() const { return rows * row_bytes; }
};

void refuse_non_finite(const CopyJob& job, const uint8_t* row, size_t first_row, size_t rows) {
  if (!job.tensor || is_quantized(job.format)) return;
  const DType dtype = job.format == WeightFormat::F32 ? DType::F32 : job.format == WeightFormat::F16 ? DType::F16 : DType::BF16;
  const int64_t at = first_non_finite(dtype, row, rows * job.row_bytes);
  if (at < 0) return;
  const size_t per_row = job.row_bytes / (job.format == WeightFormat::F32 ? 4 : 2);
  fail("{}: tensor '{}' holds a non-finite value (Inf or NaN) at row {}, column {} (of this rank's part)",
       job.file->path, *job.tensor, first_row + size_t(at) / per_row, size_t(at) % per_row);
}

void pread_all(const FileSpan& f, uint8_t* dest, size_t n, size_t offset) {
  while (n > 0) {
    const ssize_t got = ::pread(f.fd, dest, std::min(n, size_t(1) << 30), off_t(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) fail("{}: read failed at offset {}: {}", f.path, offset, got < 0 ? std::strerror(errno) : "end of file");
    dest += got;
    offset += size_t(got);
    n -= size_t(got);
  }
}

void run_job(const CopyJob& job) {
  if (job.stride == job.row_bytes) {
    // In pieces that are still in cache when checked.
    const size_t rows_per_piece = std::max<size_t>(1, (size_t(1) << 20) / std::max<size_t>(1, job.row_bytes));
    for (size_t r = 0; r < job.rows; r += rows_per_piece) {
      const size_t rows = std::min(rows_per_piece, job.rows - r);
      pread_all(*job.file, job.dest + r * job.row_bytes, rows * job.row_bytes, job.offset + r * job.row_bytes);
      refuse_non_finite(job, job.dest + r * job.row_bytes, r, rows);
    }
    return;
  }
  for (size_t r = 0; r < job.rows; ++r) {
    pread_all(*job.file, job.dest + r * job.row_bytes, job.row_bytes, job.offset + r * job.stride);
    refuse_non_finite(job, job.dest + r * job.row_bytes, r, 1);
  }
}

// Rearranges m (Plain, codes then any scales in `region`, where m.data points) into the Interleaved
// layout. A float group's new place is its old one. A quantized group's overlaps the old rows of
// the groups after it and, near the end, the scales, so the scales are copied aside first and the
// groups are done from the last to the first, a batch at a time through a small copy: peak memory
// grows by the scales and one batch, not by a copy of the matrix (the LM head's is 0.7 GB in q8).
void interleave_in_place(const WeightMatrix& m, uint8_t* region, ThreadPool& pool) {
  constexpr size_t kBatchBytes = size_t(32) << 20;
  const size_t codes_per_group = size_t(kInterleaveRows * m.row_stride);
  if (!m.scales) {
    // BF16/F16: a group's rows stay in their own bytes, only reordered, so each thread takes whole
    // groups through a copy that stays in cache (E4B bf16: the 32 MB batches through one thread's
    // copy were ~1 s of a resident load).
    pool.parallel_for(interleaved_group_count(m), [&](int64_t g0, int64_t g1) {
      std::vector<uint8_t> group;
      for (int64_t g = g0; g < g1; ++g) {
        const int64_t r0 = g * kInterleaveRows, r1 = std::min(m.rows, r0 + kInterleaveRows);
        group.assign(m.data + r0 * m.row_stride, m.data + r1 * m.row_stride);
        interleave_row_groups(m, group.data(), nullptr, region, g, g + 1);
      }
    });
    return;
  }
  const size_t scales_per_group = size_t(kInterleaveRows * m.scale_stride);
  const int64_t groups = interleaved_group_count(m);
  const int64_t batch = std::max<int64_t>(1, int64_t(kBatchBytes / codes_per_group));
  const std::vector<uint8_t> scales(m.scales, m.scales ? m.scales + m.rows * m.scale_stride : nullptr);
  std::vector<uint8_t> codes;
  for (int64_t g1 = groups; g1 > 0;) {
    const int64_t g0 = std::max<int64_t>(0, g1 - batch);
    const int64_t r0 = g0 * kInterleaveRows, r1 = std::min(m.rows, g1 * kInterleaveRows);
    const size_t batch_bytes = size_t((r1 - r0) * m.row_stride);
    codes.resize(batch_bytes);
    // Copied by all threads: one thread's copy was ~0.4 s of an E4B q4 resident load.
    pool.parallel_for(int64_t(batch_bytes), [&](int64_t a, int64_t b) {
      std::memcpy(codes.data() + a, m.data + r0 * m.row_stride + a, size_t(b - a));
    }, int64_t(1) << 20);
    pool.parallel_for(g1 - g0, [&](int64_t a, int64_t b) {
      interleave_row_groups(m, codes.data() + size_t(a) * codes_per_group,
                            m.scales ? scales.data() + size_t(g0 + a) * scales_per_group : nullptr, region, g0 + a,
                            g0 + b);
    });
    g1 = g0;
  }
}

}  // namespace

ResidentWeights::~ResidentWeights() {
  if (memory_) ::munmap(memory_, mapped_bytes_);
}

std::unique_ptr<ResidentWeights> ResidentWeights::load(ModelWeights& w, const CheckpointFiles& files, ThreadPool& pool,
                                                       bool show_progress, LayoutChooser choose_layout) {
  std::vector<FileSpan> spans;
  spans.reserve(files.files().size());
  struct CloseFiles {  // before the first open, so a failing open closes the earlier ones
    std::vector<FileSpan>& spans;
    ~CloseFiles() {
      for (auto& s : spans) ::close(s.fd);
    }
  } close_files{spans};
  for (const auto& f : files.files()) {
    FileSpan s;
    s.path = f->path();
    s.base = f->mapping().data();
    s.size = f->mapping().size();
    s.fd = ::open(s.path.c_str(), O_RDONLY | O_CLOEXEC);
    if (s.fd < 0) fail("{}: cannot open: {}", s.path, std::strerror(errno));
    spans.push_back(s);
  }
  auto span_of = [&](const uint8_t* p) -> const FileSpan& {
    for (const FileSpan& s : spans)
      if (p >= s.base && p < s.base + s.size) return s;
    fail("a weight does not point into any checkpoint file");
  };

  // Every matrix decoding streams; the LM head shares its tensor with the embedding at TP=1.
  std::vector<WeightMatrix*> matrices = {&w.lm_head, &w.ple_model_projection};
  std::vector<std::string> names = {w.prefix + "embed_tokens.weight", w.prefix + "per_layer_model_projection.weight"};
  for (size_t i = 0; i < w.layers.size(); ++i) {
    LayerWeights& l = w.layers[i];
    const std::string p = w.prefix + "layers." + std::to_string(i) + ".";
    for (auto [m, name] : {std::pair{&l.q_proj, "self_attn.q_proj"}, {&l.k_proj, "self_attn.k_proj"},
                           {&l.v_proj, "self_attn.v_proj"}, {&l.o_proj, "self_attn.o_proj"}, {&l.gate_proj, "mlp.gate_proj"},
                           {&l.up_proj, "mlp.up_proj"}, {&l.down_proj, "mlp.down_proj"},
                           {&l.ple_gate, "per_layer_input_gate"}, {&l.ple_projection, "per_layer_projection"}}) {
      matrices.push_back(m);
      names.push_back(p + name + ".weight");
    }
  }
  for (size_t i = matrices.size(); i-- > 0;)
    if (matrices[i]->empty()) {
      matrices.erase(matrices.begin() + int64_t(i));
      names.erase(names.begin() + int64_t(i));
    }
  const bool embed_is_lm_head = w.embed.data == w.lm_head.data && w.embed.rows == w.lm_head.rows;

  // Lay the copies out: data then scales of each matrix, each 64-byte aligned.
  struct Placement {
    WeightMatrix* matrix;
    size_t data_at, scales_at;
  };
  std::vector<Placement> placements;
  size_t total = 0;
  for (WeightMatrix* m : matrices) {
    Placement p{m, total, 0};
    total = round_up(total + size_t(m->rows) * size_t(row_bytes(m->format, m->cols)), kAlign);
    if (m->scales) {
      p.scales_at = total;
      total = round_up(total + size_t(m->rows) * size_t(scale_row_bytes(m->format, m->cols)), kAlign);
    }
    placements.push_back(p);
  }

  std::unique_ptr<ResidentWeights> r(new ResidentWeights());
  r->mapped_bytes_ = round_up(total, kHugePage) + kHugePage;
  void* raw = ::mmap(nullptr, r->mapped_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) fail("cannot reserve {:.2f} GB for the weights", total / 1e9);
  r->memory_ = raw;
  uint8_t* base = reinterpret_cast<uint8_t*>(round_up(reinterpret_cast<uintptr_t>(raw), kHugePage));
  ::madvise(base, round_up(total, kHugePage), MADV_HUGEPAGE);  // best effort: fewer TLB misses
  r->bytes_ = total;

  std::vector<CopyJob> jobs;
  for (size_t i = 0; i < placements.size(); ++i) {
    const Placement& p = placements[i];
    WeightMatrix& m = *p.matrix;
    const size_t rb = size_t(row_bytes(m.format, m.cols));
    const FileSpan& f = span_of(m.data);
    jobs.push_back({&f, size_t(m.data - f.base), size_t(m.rows), rb, size_t(m.row_stride), base + p.data_at, &names[i],
                    m.format});
    if (m.scales) {
      const FileSpan& sf = span_of(m.scales);
      const size_t sb = size_t(scale_row_bytes(m.format, m.cols));
      jobs.push_back({&sf, size_t(m.scales - sf.base), size_t(m.rows), sb, size_t(m.scale_stride), base + p.scales_at});
    }
  }
  // Big jobs first, then hand them out to threads in turn: roughly balanced, no locking.
  std::sort(jobs.begin(), jobs.end(), [](const CopyJob& a, const CopyJob& b) { return a.bytes() > b.bytes(); });
  Progress progress("loading weights", show_progress ? total : 0);
  std::mutex progress_mutex;
  pool.run([&](int t, int nt) {
    for (size_t i = size_t(t); i < jobs.size(); i += size_t(nt)) {
      run_job(jobs[i]);
      std::lock_guard lock(progress_mutex);
      if (show_progress) progress.advance(jobs[i].bytes());
    }
  });
  progress.finish();

  for (const Placement& p : placements) {
    WeightMatrix& m = *p.matrix;
    m.data = base + p.data_at;
    m.row_stride = row_bytes(m.format, m.cols);
    if (m.scales) {
      m.scales = base + p.scales_at;
      m.scale_stride = scale_row_bytes(m.format, m.cols);
    }
    if (choose_layout && choose_layout(m) == WeightLayout::Interleaved && can_interleave(m)) {
      interleave_in_place(m, base + p.data_at, pool);
      m.layout = WeightLayout::Interleaved;
    }
  }
  if (embed_is_lm_head) w.embed = w.lm_head;
  return r;
}

}  // namespace tandem
