// tandem bench: prefill and decode speed on one process (or one TP job), with the DRAM read
// bandwidth measured in the same run, so decode speed can be stated as a fraction of the
// memory roofline (weights streamed per token / bandwidth).
#include <fmt/format.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>

#include "cli_common.h"
#include "commands.h"
#include "core/error.h"
#include "core/memory_bandwidth.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/kernels.h"
#include "kernels/profiling_ops.h"
#include "model/gemma4.h"
#include "model/kv_cache.h"
#include "parallel/timed_communicator.h"
#include "runtime/sampler.h"

namespace tandem::cli {

namespace {

struct BenchOptions {
  ModelOptions model;
  int prompt = 512;
  int gen = 128;
  int batch = 8;
  int prefill_chunk = 2048;
  int probe_mb = 512;
  bool json = false;
  bool profile = false;
};

// Decode tokens timed between two bandwidth probes (a few seconds at E4B's speeds).
constexpr int kSegmentTokens = 16;

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

std::vector<int32_t> bench_prompt(int n, int vocab, uint32_t seed) {
  // Past the special tokens of a real vocabulary (ids below 1000); small test vocabularies too.
  const int first = std::min(1000, vocab / 2);
  std::vector<int32_t> ids = {2};
  for (int i = 1; i < n; ++i) {
    seed = seed * 1664525u + 1013904223u;
    ids.push_back(int32_t(first + (seed >> 8) % uint32_t(std::max(1, vocab - first))));
  }
  return ids;
}

// The bytes of K/V cache the attention of one decoded token reads, averaged over the decode steps
// at positions [first_position, first_position + steps): every layer reads the keys and values its
// position sees in its cache (a KV-sharing layer its donor's), all of them on full-attention layers
// and the last sliding_window on sliding ones. The roofline counts weight bytes only; at long
// contexts these reads are as large (E4B q4 at 32768 tokens, f32 cache: ~1.9 GB against 2.6).
double kv_bytes_read_per_token(const Gemma4Config& c, KvDType dtype, int first_position, int steps) {
  const double element = double(kv_dtype_size(dtype));
  double total = 0;
  for (int i = 0; i < steps; ++i) {
    const int64_t keys = int64_t(first_position) + i + 1;
    for (const LayerConfig& layer : c.layers) {
      const int64_t visible = layer.kind == AttentionKind::Sliding ? std::min<int64_t>(keys, c.sliding_window) : keys;
      total += double(visible) * layer.num_kv_heads * layer.head_dim * 2 * element;
    }
  }
  return steps > 0 ? total / steps : 0.0;
}

// The time of each kind of op call per step of one phase ("decode" or "batch"), and what the steps
// spent outside the ops (sampling, the model's bookkeeping).
nlohmann::ordered_json phase_profile(const std::vector<ProfilingOps::Entry>& entries, const std::string& phase,
                                     int steps, double seconds) {
  nlohmann::ordered_json ops = nlohmann::ordered_json::array();
  double in_ops = 0;
  for (const ProfilingOps::Entry& e : entries) {
    if (e.phase != phase) continue;
    in_ops += e.seconds;
    ops.push_back({{"op", e.what}, {"calls_per_step", double(e.calls) / steps}, {"ms_per_step", e.seconds / steps * 1e3}});
  }
  ops.push_back({{"op", "outside the ops"}, {"calls_per_step", 0}, {"ms_per_step", (seconds - in_ops) / steps * 1e3}});
  return {{"steps", steps}, {"ms_per_step", seconds / steps * 1e3}, {"ops", ops}};
}

void print_phase_profile(const std::string& phase, const nlohmann::ordered_json& p) {
  const double step_ms = p["ms_per_step"].get<double>();
  fmt::print("{}: {} steps of {:.2f} ms\n", phase, p["steps"].get<int>(), step_ms);
  for (const auto& op : p["ops"]) {
    const double ms = op["ms_per_step"].get<double>(), calls = op["calls_per_step"].get<double>();
    fmt::print("  {:<28} {:>9.3f} ms {:>6.1f}%", op["op"].get<std::string>(), ms, 100 * ms / step_ms);
    if (calls > 0) fmt::print(" {:>7.1f} calls {:>9.1f} us/call", calls, ms * 1e3 / calls);
    fmt::print("\n");
  }
}

// Cold PLE rows are disk reads (Gemma4Checkpoint::warm_ple_table). A server's page cache warms
// over its first requests; the bench measures that steady state: the whole table in the page
// cache when it fits, else at least the rows of the timed prompt.
void warm_ple_rows(const Gemma4Checkpoint& ckpt, const std::vector<int32_t>& prompt_ids) {
  if (ckpt.warm_ple_table()) return;
  const WeightMatrix& table = ckpt.weights.ple_table;
  std::vector<float> row(static_cast<size_t>(table.cols));
  for (int32_t id : prompt_ids)
    if (id >= 0 && id < table.rows) table.row_to_float(id, row.data());
}

void bench(const BenchOptions& o) {
  if (o.prompt < 1 || o.batch < 1) fail("--prompt and --batch must be positive");
  if (o.gen < 2) fail("--gen must be at least 2 (the first token comes from the prefill; decode is timed after it)");
  // Before the weights load (a minute for bf16 E4B from disk): a prompt the model can't hold.
  constexpr int kBatchPrompt = 16;  // each sequence of the batched phase: this prompt, then batch_steps
  const int batch_steps = std::max(4, o.gen / 4);
  const int context = Gemma4Config::load(resolve_model_dir(o.model.model_dir)).max_position_embeddings;
  if (int64_t(o.prompt) + o.gen > context || kBatchPrompt + batch_steps > context)
    fail("--prompt {} plus --gen {} exceed the model's context of {} positions", o.prompt, o.gen, context);
  Communicator& comm = world();
  TimedCommunicator timed(comm);
  ThreadPool pool(o.model.threads > 0 ? o.model.threads : default_threads());
  // The probe's buffer is touched before the model loads and stays resident to the end, so it is
  // subtracted from peak RSS exactly.
  ReadBandwidthProbe probe(pool, size_t(o.probe_mb) << 20);
  const double load_start = now();
  auto ckpt = Gemma4Checkpoint::open(resolve_model_dir(o.model.model_dir), ShardPlan{comm.rank(), comm.size()},
                                     weight_residency(o.model.weights), pool, comm.rank() == 0,
                                     layout_chooser(o.model.weight_layout, o.model.weights));
  // The job is ready when its slowest rank is.
  const float rank_load_s = float(now() - load_start);
  std::vector<float> rank_loads(size_t(comm.size()));
  comm.all_gather(&rank_load_s, rank_loads.data(), sizeof(float));
  const double load_s = *std::max_element(rank_loads.begin(), rank_loads.end());
  const Gemma4Config& c = ckpt->config;
  cpu::CpuOps cpu_ops(pool);
  ProfilingOps profiling(cpu_ops);  // counts nothing until a phase is set (--profile)
  Ops& ops = o.profile ? static_cast<Ops&>(profiling) : cpu_ops;
  auto profile_phase = [&](const char* phase) {
    if (o.profile) profiling.set_phase(phase);
  };

  // The machine's read bandwidth, with every rank on it reading at once as they do when decoding:
  // each rank measures its share and the job reads at their sum. On a shared host what a process
  // gets drifts by 1.5x within seconds (Zen 4 VM, 2026-12-03: 30-50 GB/s from one probe to the
  // next, the matvec kernels moving with it), so one probe before decoding would compare the decode
  // with whatever the neighbours did then. Decode is timed in segments, each between two probes
  // (the batched decode's steps run between one segment's closing probe and the next one's
  // opening probe); each segment counts against the higher of its two probes (an underestimate
  // would flatter the roofline), and read_bw is their time-weighted mean: the bytes the machine
  // offered during the decode over its duration.
  //
  // What is read is the weights' own memory where they are resident and at least as large as the
  // probe's buffer (512 MB by default: far larger than the caches; a small --probe-mb lets cached
  // weights in, and weakens the roofline): how fast a read runs also depends on where in physical
  // memory the bytes lie (docs/benchmarks.md, "Where the bytes lie"), so a separate buffer could
  // sit on faster or slower memory than the weights. Mapped weights may be partly on disk, and
  // small ones in the caches; there the buffer stands in. The buffer is probed in every case.
  const std::vector<ByteRange> weight_ranges = merge_ranges(ckpt->weights.streamed_ranges());
  const bool resident = weight_residency(o.model.weights) == WeightResidency::Resident;
  float buffer_instead = !resident || ckpt->weights.streamed_bytes_per_token() < probe.bytes() ? 1.0f : 0.0f;
  comm.all_reduce_sum(&buffer_instead, 1);
  const bool probe_weights = buffer_instead == 0;
  struct Bandwidth {
    double read = 0;    // what the roofline is measured against: the weights, or the buffer (see above)
    double buffer = 0;  // the separate buffer
  };
  auto probe_bandwidth = [&] {
    comm.barrier();
    float rank_bw[2] = {float(probe.measure(3)), 0.0f};
    if (probe_weights) comm.barrier();  // every rank reads its weights at once, as when decoding
    rank_bw[1] = probe_weights ? float(measure_read_bandwidth_of(pool, weight_ranges, 2)) : rank_bw[0];
    comm.all_reduce_sum(rank_bw, 2);
    return Bandwidth{double(rank_bw[1]), double(rank_bw[0])};
  };

  // The prompt goes in chunks of at most --prefill-chunk tokens, as a server's steps take it: one
  // step of a 131072-token prompt would need ~40 GB of E4B activations (the MLP's 2 x 10240 and the
  // per-layer inputs' 10752 floats per token).
  const int step_tokens = std::max({std::min(o.prompt, o.prefill_chunk), 16 * o.batch});  // warm-up, batch prompts: 16
  KvCacheOptions kv;
  kv.block_size = 16;
  kv.dtype = kv_dtype_option(o.model.kv_dtype, ckpt->weights);
  // The single sequence and the batch decode side by side (below): room for one more sequence.
  kv.full_blocks = int64_t(o.batch + 1) * ((o.prompt + o.gen + 15) / 16 + 1);
  kv.sliding_blocks = int64_t(o.batch + 1) * KvCache::sliding_blocks_per_sequence(c, 16, step_tokens);
  KvCache cache(c, ckpt->weights, kv);
  // The blocks the timed phases use are backed now, as in a server that has run a while (or
  // `serve --kv-prefault`): first touches of fresh pages cost the VM ~10 us per 4 KB, would land
  // in the timed steps, and are not the engine's. The rest of the pool stays unbacked.
  {
    const KvSequenceBlocks fresh;
    const auto [single_full, single_sliding] = cache.blocks_needed(fresh, o.prompt + o.gen);
    const auto [each_full, each_sliding] = cache.blocks_needed(fresh, kBatchPrompt + batch_steps);
    cache.prefault_blocks(single_full + o.batch * each_full, single_sliding + o.batch * each_sliding);
  }
  Gemma4Model model(c, ckpt->weights, ops, timed, cache, step_tokens, o.batch);
  const int64_t vocab_local = model.vocab_local();

  // Each sequence's next token as the engine picks a greedy request's: the sampler over its logits
  // row (this rank's slice of the vocabulary: the bench measures speed, not text).
  SamplingParams greedy;
  greedy.temperature = 0;
  std::vector<Sampler> samplers(size_t(o.batch) + 1, Sampler(greedy, {}));  // the last: the single sequence's
  Sampler* const single_sampler = &samplers.back();
  auto run = [&](std::vector<KvSequenceBlocks>& seqs, std::vector<std::vector<int32_t>>& tokens,
                 Sampler* sampler) {
    std::vector<StepSequence> batch(seqs.size());
    for (size_t s = 0; s < seqs.size(); ++s) {
      if (!cache.reserve(seqs[s], seqs[s].length + int(tokens[s].size()))) fail("bench KV cache too small");
      batch[s] = {&seqs[s], tokens[s], 1};
    }
    model.forward(batch);
    // Side by side on the pool, as the engine samples a step's rows (EngineOptions::sampling_pool).
    const auto sample_rows = [&](int64_t first, int64_t end) {
      for (int64_t s = first; s < end; ++s)
        tokens[size_t(s)] = {sampler[s].sample(std::span(model.logits(int(s)), size_t(vocab_local))).token};
    };
    if (seqs.size() > 1) pool.parallel_for(int64_t(seqs.size()), sample_rows);
    else sample_rows(0, 1);
  };

  // Warm-up: page every weight in (the first touch of an mmapped checkpoint reads the disk).
  {
    std::vector<KvSequenceBlocks> seqs(1);
    std::vector<std::vector<int32_t>> tokens = {bench_prompt(16, c.vocab_size, 1)};
    for (int i = 0; i < 3; ++i) run(seqs, tokens, single_sampler);
    cache.release(seqs[0]);
  }

  // Single sequence: one prefill of --prompt tokens, then --gen decode steps. The batched decode
  // (--batch sequences stepping together, weights read once per step for all) runs its steps in
  // turns with the single sequence's decode segments, so that both meet the same states of a
  // shared host: run one after the other, its speed flipping by 1.5x within seconds made their
  // ratio, the batch's gain, 3.1x in one run and 5.1x in the next for the same build
  // (docs/benchmarks.md, run 34).
  std::vector<KvSequenceBlocks> many(size_t(o.batch));
  std::vector<std::vector<int32_t>> many_tokens;
  for (int s = 0; s < o.batch; ++s) many_tokens.push_back(bench_prompt(kBatchPrompt, c.vocab_size, 10 + uint32_t(s)));
  run(many, many_tokens, samplers.data());  // the batch's prompts: untimed
  std::vector<KvSequenceBlocks> seqs(1);
  const std::vector<int32_t> prompt = bench_prompt(o.prompt, c.vocab_size, 2);
  warm_ple_rows(*ckpt, prompt);
  comm.barrier();
  double t0 = now();
  const int prefill_chunks = (o.prompt + o.prefill_chunk - 1) / o.prefill_chunk;
  for (int first = 0; first < o.prompt; first += o.prefill_chunk) {
    const int n = std::min(o.prefill_chunk, o.prompt - first);
    if (!cache.reserve(seqs[0], first + n)) fail("bench KV cache too small");
    const StepSequence chunk{&seqs[0], std::span(prompt).subspan(size_t(first), size_t(n)), first + n == o.prompt ? 1 : 0};
    model.forward(std::span(&chunk, 1));
  }
  std::vector<std::vector<int32_t>> tokens = {{single_sampler->sample(std::span(model.logits(0), size_t(vocab_local))).token}};
  const double ttft = now() - t0;
  timed.reset();
  double decode_s = 0, offered_gb = 0, buffer_offered_gb = 0, batch_s = 0, timed_comm_s = 0;
  const int segments = (o.gen - 1 + kSegmentTokens - 1) / kSegmentTokens;
  Bandwidth bw_before = probe_bandwidth();
  for (int segment = 0, done = 1; done < o.gen; ++segment) {
    const int steps = std::min(kSegmentTokens, o.gen - done);
    const double start = now();
    profile_phase("decode");
    for (int i = 0; i < steps; ++i) run(seqs, tokens, single_sampler);
    const double seconds = now() - start;
    profile_phase("");
    timed_comm_s += timed.seconds();
    const Bandwidth bw_after = probe_bandwidth();
    decode_s += seconds;
    offered_gb += seconds * std::max(bw_before.read, bw_after.read);
    buffer_offered_gb += seconds * std::max(bw_before.buffer, bw_after.buffer);
    done += steps;
    // This segment's share of the batch steps, then a probe for the next segment to start from.
    const int batch_here = batch_steps * (segment + 1) / segments - batch_steps * segment / segments;
    const double batch_start = now();
    profile_phase("batch");
    for (int i = 0; i < batch_here; ++i) run(many, many_tokens, samplers.data());
    batch_s += now() - batch_start;
    profile_phase("");
    timed.reset();
    bw_before = done < o.gen ? probe_bandwidth() : bw_after;
  }
  const double read_bw = offered_gb / decode_s, buffer_read_bw = buffer_offered_gb / decode_s;
  const double comm_per_token = timed_comm_s / std::max(1, o.gen - 1);
  cache.release(seqs[0]);
  for (auto& s : many) cache.release(s);
  const double decode_tok_s = (o.gen - 1) / decode_s;
  const double batch_tok_s = double(batch_steps) * o.batch / batch_s;

  // Peak RSS of every rank (each holds its own slices of the weights).
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  std::vector<float> rss_gb(size_t(comm.size()), 0.0f);
  // This rank's own count in bytes (rank 0 prints), exact; the per-rank figures travel as floats.
  const int64_t peak_rss = int64_t(usage.ru_maxrss) * 1024 - int64_t(probe.bytes());
  rss_gb[size_t(comm.rank())] = float(double(peak_rss) / 1e9);
  comm.all_reduce_sum(rss_gb.data(), rss_gb.size());
  const double bytes_per_token = double(ckpt->weights.streamed_bytes_per_token());
  // Every rank streams its share at the same time: the job's rate is the sum over ranks.
  std::vector<float> per_rank(size_t(comm.size()), 0.0f);
  per_rank[size_t(comm.rank())] = float(bytes_per_token);
  comm.all_reduce_sum(per_rank.data(), per_rank.size());
  double job_bytes_per_token = 0;
  for (float b : per_rank) job_bytes_per_token += double(b);
  const double roofline = decode_tok_s * job_bytes_per_token / (read_bw * 1e9);
  // The single sequence decodes o.gen - 1 steps after its prompt, at positions o.prompt on.
  const double kv_bytes_per_token = kv_bytes_read_per_token(c, kv.dtype, o.prompt, o.gen - 1);
  const double roofline_with_kv = decode_tok_s * (job_bytes_per_token + kv_bytes_per_token) / (read_bw * 1e9);
  const double buffer_roofline = decode_tok_s * job_bytes_per_token / (buffer_read_bw * 1e9);
  const char* read_what = probe_weights ? "weights" : "buffer";

  if (comm.rank() != 0) return;
  nlohmann::ordered_json profile;
  if (o.profile) {
    const std::vector<ProfilingOps::Entry> entries = profiling.entries();
    profile["decode"] = phase_profile(entries, "decode", o.gen - 1, decode_s);
    profile["batch"] = phase_profile(entries, "batch", batch_steps, batch_s);
  }
  if (o.json) {
    nlohmann::ordered_json j = {
        {"load_s", load_s},
        {"prefill_tok_s", o.prompt / ttft},
        {"decode_tok_s", decode_tok_s},
        {"ttft_s", ttft},
        {"peak_rss_bytes", peak_rss},
        {"peak_rss_gb_per_rank", rss_gb},
        {"weight_bytes_per_token", job_bytes_per_token},
        {"read_bw_gb_s", read_bw},
        {"roofline", roofline},
        {"read_bw_of", read_what},
        {"buffer_read_bw_gb_s", buffer_read_bw},
        {"buffer_roofline", buffer_roofline},
        {"kv_dtype", std::string(kv_dtype_name(kv.dtype))},
        {"kv_bytes_per_token", kv_bytes_per_token},
        {"roofline_with_kv", roofline_with_kv},
        {"prefill_steps", prefill_chunks},
        {"batch", o.batch},
        {"batch_decode_tok_s", batch_tok_s},
        {"ranks", comm.size()},
        {"threads_per_rank", pool.size()},
        {"comm_s_per_token", comm_per_token},
        {"isa", std::string(isa_name(cpu_ops.kernels().isa))},
        {"weights", std::string(weight_format_name(ckpt->weights.layers[0].gate_proj.format))},
        {"residency", o.model.weights},
        {"weight_layout", loaded_weight_layout(ckpt->weights)},
    };
    if (o.profile) j["profile"] = profile;
    fmt::print("{}\n", j.dump());
    return;
  }
  fmt::print("model           {} ({} weights, {}, {} layout, {} ranks x {} threads, {})\n", ckpt->dir,
             weight_format_name(ckpt->weights.layers[0].gate_proj.format), o.model.weights,
             loaded_weight_layout(ckpt->weights), comm.size(), pool.size(), isa_name(cpu_ops.kernels().isa));
  fmt::print("load            {:.2f} s (open the checkpoint and place its weights)\n", load_s);
  fmt::print("prefill         {:.1f} tok/s ({} tokens{}, time to first token {:.3f} s)\n", o.prompt / ttft, o.prompt,
             prefill_chunks > 1 ? fmt::format(" in {} steps of up to {}", prefill_chunks, o.prefill_chunk) : "", ttft);
  fmt::print("decode          {:.2f} tok/s ({} tokens)\n", decode_tok_s, o.gen);
  fmt::print("batched decode  {:.2f} tok/s aggregate ({} sequences, {:.2f}x single)\n", batch_tok_s, o.batch,
             batch_tok_s / decode_tok_s);
  fmt::print("weights/token   {:.3f} GB streamed\n", job_bytes_per_token / 1e9);
  fmt::print("KV cache/token  {:.3f} GB read by attention ({} cache; mean over the decode steps)\n",
             kv_bytes_per_token / 1e9, kv_dtype_name(kv.dtype));
  fmt::print("read bandwidth  {:.1f} GB/s reading the {} ({:.1f} GB/s a separate {} MB buffer; probes between decode "
             "segments of {} tokens)\n",
             read_bw, probe_weights ? "weights' own memory" : "buffer (mapped or small weights)", buffer_read_bw,
             probe.bytes() >> 20, kSegmentTokens);
  fmt::print("roofline        {:.2f} (weight bytes/s over read bandwidth; {:.2f} against the buffer; {:.2f} with the "
             "KV cache's bytes)\n",
             roofline, buffer_roofline, roofline_with_kv);
  fmt::print("peak RSS        {:.2f} GB per rank\n", fmt::join(rss_gb, " / "));
  if (comm.size() > 1) fmt::print("communication   {:.2f} ms per decoded token\n", comm_per_token * 1e3);
  if (o.profile) {
    fmt::print("\nwhere a step's time goes (rank 0, per step):\n");
    print_phase_profile("decode", profile["decode"]);
    print_phase_profile(fmt::format("batch of {}", o.batch), profile["batch"]);
  }
}

}  // namespace

void register_bench(CLI::App& app) {
  auto* cmd = app.add_subcommand("bench", "Measure prefill and decode speed against the memory-bandwidth roofline");
  auto o = std::make_shared<BenchOptions>();
  add_model_options(*cmd, o->model);
  cmd->add_option("--prompt", o->prompt, "Prompt tokens to prefill")->default_val(512);
  cmd->add_option("--gen", o->gen, "Tokens to decode")->default_val(128);
  cmd->add_option("--batch", o->batch, "Sequences in the batched-decode run")->default_val(8);
  cmd->add_option("--prefill-chunk", o->prefill_chunk,
                  "Most prompt tokens per prefill step (a longer prompt is prefilled in several steps)")
      ->default_val(2048)
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--probe-mb", o->probe_mb,
                  "Size of the read-bandwidth probe's own buffer (keep it far larger than the caches); resident "
                  "weights at least this large are read in its place")
      ->default_val(512)
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_flag("--json", o->json, "Print one JSON object");
  cmd->add_flag("--profile", o->profile,
                "Also time every op call of the decode and batch steps and print where a step's time goes "
                "(JSON: \"profile\")");
  cmd->callback([o] { bench(*o); });
}

}  // namespace tandem::cli
