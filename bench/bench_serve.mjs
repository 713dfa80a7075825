#!/usr/bin/env node
// Load test for a running `tandem serve` (or any OpenAI-compatible server): streams completions at
// several concurrency levels and reports aggregate output tokens/s and latency percentiles
// (time to first token, inter-token latency, end-to-end). Node 18+, no packages needed.
//
//   node bench/bench_serve.mjs [--url http://127.0.0.1:8080] [--concurrency 1,4,8,16]
//        [--requests N] [--prompt-tokens 256] [--max-tokens 128] [--api-key KEY] [--model ID]
//        [--temperature 0] [--top-k K] [--json results.json]
//
// Each request sends a prompt of exactly --prompt-tokens token ids (<bos> then pseudo-random ids,
// so prompt length does not depend on the tokenizer) to /v1/completions with stream: true and
// ignore_eos: true, so every request generates exactly --max-tokens tokens, greedy unless
// --temperature is above 0 (then sampled, with top_k K when --top-k is given: 0 or -1 turns the
// model's default top-k off, the case where sampling reads the whole vocabulary). --requests is per level
// (default: 4 x the concurrency, at least 8). docs/server.md shows how to run it on an E4B-shaped model.
import { sse_chunks } from "./sse_events.mjs";

function parse_args(argv) {
  const options = {
    url: "http://127.0.0.1:8080", concurrency: "1,4,8,16", requests: 0, prompt_tokens: 256,
    max_tokens: 128, api_key: process.env.TANDEM_API_KEY ?? "", model: "", json: "", temperature: 0, top_k: "",
  };
  for (let i = 0; i < argv.length; i += 2) {
    const key = argv[i].replace(/^--/, "").replaceAll("-", "_");
    if (!(key in options) || argv[i + 1] === undefined) {
      console.error(`unknown or incomplete option ${argv[i]}\n(see the comment at the top of bench/bench_serve.mjs)`);
      process.exit(2);
    }
    options[key] = typeof options[key] === "number" ? Number(argv[i + 1]) : argv[i + 1];
  }
  options.levels = options.concurrency.split(",").map(Number).filter((n) => n > 0);
  return options;
}

const options = parse_args(process.argv.slice(2));
const headers = { "Content-Type": "application/json" };
if (options.api_key) headers.Authorization = `Bearer ${options.api_key}`;

function percentile(values, p) {
  if (values.length === 0) return NaN;
  const sorted = [...values].sort((a, b) => a - b);
  const rank = (p / 100) * (sorted.length - 1);
  const low = Math.floor(rank), high = Math.ceil(rank);
  return sorted[low] + (sorted[high] - sorted[low]) * (rank - low);
}

// A deterministic prompt of exactly n token ids: <bos> (2), then ids from an LCG over ordinary vocabulary.
function prompt_ids(n, seed) {
  const ids = [2];
  let x = seed >>> 0;
  while (ids.length < n) {
    x = (Math.imul(x, 1664525) + 1013904223) >>> 0;
    ids.push(1000 + (x % 200000));
  }
  return ids;
}

// One streamed request; times are in seconds from its start.
async function run_request(model, seed) {
  const start = performance.now();
  const response = await fetch(`${options.url}/v1/completions`, {
    method: "POST",
    headers,
    body: JSON.stringify({
      model, prompt: prompt_ids(options.prompt_tokens, seed), max_tokens: options.max_tokens,
      temperature: options.temperature, ...(options.top_k === "" ? {} : { top_k: Number(options.top_k) }),
      ignore_eos: true, stream: true, stream_options: { include_usage: true },
    }),
  });
  if (!response.ok) throw new Error(`HTTP ${response.status}: ${await response.text()}`);
  let first = NaN, last = NaN, tokens = 0;
  const gaps = [];
  for await (const chunk of sse_chunks(response)) {
    if (chunk.usage) tokens = chunk.usage.completion_tokens;
    if (!chunk.choices?.[0]?.text) continue;
    const now = (performance.now() - start) / 1000;
    if (Number.isNaN(first)) first = now;
    else gaps.push(now - last);
    last = now;
  }
  return { ttft: first, gaps, e2e: (performance.now() - start) / 1000, tokens };
}

// Every request of the run gets a prompt of its own: the server keeps ended requests' prefixes, and a
// prompt sent again would be served from them (docs/server.md, "Prefix reuse").
let prompts_sent = 0;

async function run_level(model, concurrency) {
  const total = options.requests > 0 ? options.requests : Math.max(8, 4 * concurrency);
  let next = 0;
  const results = [];
  const start = performance.now();
  const worker = async () => {
    while (next < total) {
      next++;
      results.push(await run_request(model, 1000 + prompts_sent++));
    }
  };
  await Promise.all(Array.from({ length: concurrency }, worker));
  const seconds = (performance.now() - start) / 1000;
  const tokens = results.reduce((sum, r) => sum + r.tokens, 0);
  const ttft = results.map((r) => r.ttft), itl = results.flatMap((r) => r.gaps), e2e = results.map((r) => r.e2e);
  return {
    concurrency, requests: total, seconds, output_tokens: tokens,
    output_tokens_per_s: tokens / seconds, requests_per_s: total / seconds,
    ttft_p50: percentile(ttft, 50), ttft_p95: percentile(ttft, 95),
    itl_p50: percentile(itl, 50), itl_p95: percentile(itl, 95),
    e2e_p50: percentile(e2e, 50), e2e_p95: percentile(e2e, 95),
  };
}

async function main() {
  let model = options.model;
  if (!model) {
    const models = await fetch(`${options.url}/v1/models`, { headers });
    if (!models.ok) throw new Error(`GET /v1/models: HTTP ${models.status}: ${await models.text()}`);
    model = (await models.json()).data[0].id;
  }
  console.error(`model ${model}: prompts of ${options.prompt_tokens} tokens, ${options.max_tokens} generated per request`);
  await run_request(model, 1);  // warm-up: page in the weights
  const ms = (s) => (s * 1000).toFixed(1).padStart(9);
  console.log("concurrency  requests  out tok/s  req/s  TTFT p50  TTFT p95  ITL p50   ITL p95   e2e p50   e2e p95  (ms)");
  const levels = [];
  for (const concurrency of options.levels) {
    const r = await run_level(model, concurrency);
    levels.push(r);
    console.log(`${String(r.concurrency).padStart(11)} ${String(r.requests).padStart(9)} ${r.output_tokens_per_s.toFixed(1).padStart(10)} ` +
                `${r.requests_per_s.toFixed(2).padStart(6)}${ms(r.ttft_p50)} ${ms(r.ttft_p95)}${ms(r.itl_p50)} ${ms(r.itl_p95)}` +
                `${ms(r.e2e_p50)} ${ms(r.e2e_p95)}`);
  }
  if (options.json) {
    const { writeFileSync } = await import("node:fs");
    writeFileSync(options.json, JSON.stringify({ model, prompt_tokens: options.prompt_tokens, max_tokens: options.max_tokens, levels }, null, 2));
  }
}

main().catch((e) => {
  console.error(`bench_serve: ${e.message}`);
  process.exit(1);
});
