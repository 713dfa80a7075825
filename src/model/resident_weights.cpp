#include "model/resident_weights.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>

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
  // Set for a block of a Q8/Q4 matrix going into the Interleaved layout: its rows' scales, read
  // like the codes; both pass through a staging buffer and land in dest rearranged.
  const FileSpan* scales_file = nullptr;
  size_t scales_offset = 0, scale_bytes = 0, scales_stride = 0;
  WeightFormat format = WeightFormat::F32;
  int64_t cols = 0;
  size_t bytes() const { return rows * (row_bytes + scale_bytes); }
};

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

void read_rows(const FileSpan& f, size_t offset, size_t rows, size_t row_bytes, size_t stride, uint8_t* dest) {
  if (stride == row_bytes) return pread_all(f, dest, rows * row_bytes, offset);
  for (size_t r = 0; r < rows; ++r) pread_all(f, dest + r * row_bytes, row_bytes, offset + r * stride);
}

void run_job(const CopyJob& job) {
  if (!job.scales_file) return read_rows(*job.file, job.offset, job.rows, job.row_bytes, job.stride, job.dest);
  thread_local std::vector<uint8_t> staging;
  staging.resize(job.bytes());
  uint8_t* scales = staging.data() + job.rows * job.row_bytes;
  read_rows(*job.file, job.offset, job.rows, job.row_bytes, job.stride, staging.data());
  read_rows(*job.scales_file, job.scales_offset, job.rows, job.scale_bytes, job.scales_stride, scales);
  WeightMatrix plain;
  plain.format = job.format;
  plain.rows = int64_t(job.rows);
  plain.cols = job.cols;
  plain.data = staging.data();
  plain.row_stride = int64_t(job.row_bytes);
  plain.scales = scales;
  plain.scale_stride = int64_t(job.scale_bytes);
  write_interleaved(plain, job.dest);
}

// Interleaved matrices are read in blocks of whole row groups of about this size, so the staging
// buffer stays small and the blocks spread over the threads.
constexpr size_t kInterleaveBlockBytes = size_t(4) << 20;

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
  for (LayerWeights& l : w.layers)
    for (WeightMatrix* m : {&l.q_proj, &l.k_proj, &l.v_proj, &l.o_proj, &l.gate_proj, &l.up_proj, &l.down_proj,
                            &l.ple_gate, &l.ple_projection})
      matrices.push_back(m);
  std::erase_if(matrices, [](const WeightMatrix* m) { return m->empty(); });
  const bool embed_is_lm_head = w.embed.data == w.lm_head.data && w.embed.rows == w.lm_head.rows;

  // Lay the copies out: data then scales of each matrix (or the Interleaved whole), 64-byte aligned.
  struct Placement {
    WeightMatrix* matrix;
    bool interleave;
    size_t data_at, scales_at;
  };
  std::vector<Placement> placements;
  size_t total = 0;
  for (WeightMatrix* m : matrices) {
    const bool interleave = choose_layout && choose_layout(*m) == WeightLayout::Interleaved && can_interleave(*m);
    Placement p{m, interleave, total, 0};
    if (interleave) {
      total = round_up(total + size_t(interleaved_bytes(m->format, m->rows, m->cols)), kAlign);
    } else {
      total = round_up(total + size_t(m->rows) * size_t(row_bytes(m->format, m->cols)), kAlign);
      if (m->scales) {
        p.scales_at = total;
        total = round_up(total + size_t(m->rows) * size_t(m->cols / kQuantBlock) * 2, kAlign);
      }
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
  for (const Placement& p : placements) {
    WeightMatrix& m = *p.matrix;
    const size_t rb = size_t(row_bytes(m.format, m.cols));
    const FileSpan& f = span_of(m.data);
    if (p.interleave) {
      const FileSpan& sf = span_of(m.scales);
      const size_t sb = size_t(scale_row_bytes(m.format, m.cols));
      const size_t group = size_t(kInterleaveGroupRows);
      const size_t block = std::max(group, kInterleaveBlockBytes / (rb + sb) / group * group);
      for (size_t r0 = 0; r0 < size_t(m.rows); r0 += block) {
        CopyJob job{&f, size_t(m.data - f.base) + r0 * size_t(m.row_stride), std::min(block, size_t(m.rows) - r0), rb,
                    size_t(m.row_stride), base + p.data_at + size_t(interleaved_bytes(m.format, int64_t(r0), m.cols))};
        job.scales_file = &sf;
        job.scales_offset = size_t(m.scales - sf.base) + r0 * size_t(m.scale_stride);
        job.scale_bytes = sb;
        job.scales_stride = size_t(m.scale_stride);
        job.format = m.format;
        job.cols = m.cols;
        jobs.push_back(job);
      }
      continue;
    }
    jobs.push_back({&f, size_t(m.data - f.base), size_t(m.rows), rb, size_t(m.row_stride), base + p.data_at});
    if (m.scales) {
      const FileSpan& sf = span_of(m.scales);
      const size_t sb = size_t(m.cols / kQuantBlock) * 2;
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
    if (p.interleave) {
      m = interleaved_matrix(m.format, m.rows, m.cols, base + p.data_at);
      continue;
    }
    m.data = base + p.data_at;
    m.row_stride = row_bytes(m.format, m.cols);
    if (m.scales) {
      m.scales = base + p.scales_at;
      m.scale_stride = (m.cols / kQuantBlock) * 2;
    }
  }
  if (embed_is_lm_head) w.embed = w.lm_head;
  return r;
}

}  // namespace tandem
