// How far quantized weights move the model: runs the same token streams through a reference
// checkpoint (bf16) and a candidate (q8/q4), teacher-forced, and compares the logits at every
// position: top-1 agreement, mean and max absolute logit error, mean KL divergence.
//   build/bench/quant_accuracy REF_DIR CANDIDATE_DIR [positions=2048] [threads=0] [candidate_kv=f32]
// With CANDIDATE_DIR = REF_DIR and candidate_kv = bf16 it measures how far a perturbation of known
// size (K/V rounded to bf16, ~0.2% relative) moves the same model: the model's own sensitivity, the
// yardstick the quantized figures need (random weights amplify small errors far more than trained
// ones; docs/quantization.md).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "kernels/cpu/cpu_ops.h"
#include "model/checkpoint.h"
#include "model/gemma4.h"
#include "model/kv_cache.h"

namespace {

using namespace tandem;

constexpr int kSequence = 256;  // positions per token stream
constexpr int kChunk = 32;      // positions per forward call (logit rows)

struct Runner {
  std::unique_ptr<Gemma4Checkpoint> ckpt;
  std::unique_ptr<KvCache> cache;
  std::unique_ptr<Gemma4Model> model;
  KvSequenceBlocks seq;
  Runner(const std::string& dir, Ops& ops, Communicator& comm, KvDType kv_dtype = KvDType::F32)
      : ckpt(Gemma4Checkpoint::open(dir)) {
    KvCacheOptions o;
    o.full_blocks = kSequence / 16 + 1;
    o.sliding_blocks = KvCache::sliding_blocks_per_sequence(ckpt->config, 16, kChunk);
    o.dtype = kv_dtype;
    cache = std::make_unique<KvCache>(ckpt->config, ckpt->weights, o);
    model = std::make_unique<Gemma4Model>(ckpt->config, ckpt->weights, ops, comm, *cache, kChunk, kChunk);
  }
  void run(std::span<const int32_t> tokens) {
    if (!cache->reserve(seq, seq.length + int(tokens.size()))) throw std::runtime_error("KV cache too small");
    StepSequence s{&seq, tokens, int(tokens.size())};
    model->forward(std::span(&s, 1));
  }
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    fmt::print(stderr, "usage: {} REF_DIR CANDIDATE_DIR [positions] [threads] [candidate_kv=f32|bf16]\n", argv[0]);
    return 2;
  }
  const int positions = argc > 3 ? std::atoi(argv[3]) : 2048;
  ThreadPool pool(argc > 4 ? std::atoi(argv[4]) : 0);
  cpu::CpuOps ops(pool);
  LocalCommunicator comm;
  const std::string candidate_kv = argc > 5 ? argv[5] : "f32";
  if (candidate_kv != "f32" && candidate_kv != "bf16") {
    fmt::print(stderr, "candidate_kv must be f32 or bf16\n");
    return 2;
  }
  Runner ref(argv[1], ops, comm);
  Runner cand(argv[2], ops, comm, candidate_kv == "bf16" ? KvDType::BF16 : KvDType::F32);
  const int64_t vocab = ref.ckpt->config.vocab_size;

  uint32_t rng = 12345;
  int64_t agree = 0, count = 0;
  double abs_sum = 0, abs_max = 0, kl_sum = 0;
  std::vector<int32_t> tokens(kSequence);
  for (int done = 0; done < positions; done += kSequence) {
    tokens[0] = 2;
    for (int i = 1; i < kSequence; ++i) {
      rng = rng * 1664525u + 1013904223u;
      tokens[size_t(i)] = int32_t(1000 + (rng >> 8) % uint32_t(vocab - 1000));
    }
    ref.cache->release(ref.seq);
    cand.cache->release(cand.seq);
    for (int at = 0; at < kSequence && done + at < positions; at += kChunk) {
      std::span<const int32_t> chunk(tokens.data() + at, kChunk);
      ref.run(chunk);
      cand.run(chunk);
      for (int r = 0; r < kChunk; ++r) {
        const float* a = ref.model->logits(r);
        const float* b = cand.model->logits(r);
        agree += std::max_element(a, a + vocab) == a + (std::max_element(b, b + vocab) - b);
        const float ma = *std::max_element(a, a + vocab), mb = *std::max_element(b, b + vocab);
        double za = 0, zb = 0;
        for (int64_t v = 0; v < vocab; ++v) {
          const double d = std::abs(double(a[v]) - b[v]);
          abs_sum += d;
          abs_max = std::max(abs_max, d);
          za += std::exp(double(a[v]) - ma);
          zb += std::exp(double(b[v]) - mb);
        }
        double kl = 0;  // KL(ref || candidate)
        for (int64_t v = 0; v < vocab; ++v) {
          const double pa = std::exp(double(a[v]) - ma) / za;
          const double lpa = double(a[v]) - ma - std::log(za), lpb = double(b[v]) - mb - std::log(zb);
          kl += pa * (lpa - lpb);
        }
        kl_sum += kl;
        ++count;
      }
    }
  }
  fmt::print("{{\"positions\": {}, \"top1_agreement\": {:.4f}, \"mean_abs_logit_error\": {:.5f}, "
             "\"max_abs_logit_error\": {:.4f}, \"mean_kl\": {:.6f}}}\n",
             count, double(agree) / count, abs_sum / (double(count) * vocab), abs_max, kl_sum / count);
  return 0;
}
