// Drives a running `tandem serve` with the official OpenAI Node SDK for tests/server; prints one
// JSON document with what it saw, and the C++ test makes the assertions.
//
//   node server_client.mjs CHECK BASE_URL MODEL [ARGS...]
//   CHECK: chat | stop | seed | tools | completions | choices | structured | errors | concurrency | auth KEY |
//          flood N MAX_TOKENS
import Ajv from "ajv";
import OpenAI from "openai";

const [check, baseURL, model, ...args] = process.argv.slice(2);
if (!check || !baseURL || !model) {
  console.error("usage: node server_client.mjs CHECK BASE_URL MODEL [ARGS...]");
  process.exit(2);
}
const client = new OpenAI({ baseURL: `${baseURL}/v1`, apiKey: "unused", maxRetries: 0, timeout: 300_000 });
const greedy = { model, temperature: 0 };

async function collect(stream) {
  const chunks = [];
  for await (const chunk of stream) chunks.push(chunk);
  return chunks;
}

// Reassembles a chat stream: content, reasoning, tool calls, finish reason, usage.
function chat_from_chunks(chunks) {
  const out = { content: "", reasoning: "", tool_calls: [], finish_reason: null, usage: null, chunks: chunks.length };
  for (const c of chunks) {
    if (c.usage) out.usage = c.usage;
    for (const choice of c.choices) {
      const d = choice.delta ?? {};
      if (d.content) out.content += d.content;
      if (d.reasoning_content) out.reasoning += d.reasoning_content;
      for (const t of d.tool_calls ?? []) out.tool_calls.push(t);
      if (choice.finish_reason) out.finish_reason = choice.finish_reason;
    }
  }
  return out;
}

// Reassembles each choice of a stream with several (n, or a batch of prompts), by index: text
// (completions) or content (chat), and the finish reason.
function choices_from_chunks(chunks) {
  const out = [];
  for (const c of chunks)
    for (const choice of c.choices) {
      const o = (out[choice.index] ??= { text: "", finish_reason: null });
      o.text += choice.text ?? choice.delta?.content ?? "";
      if (choice.finish_reason) o.finish_reason = choice.finish_reason;
    }
  return out;
}

async function api_error(promise) {
  try {
    const value = await promise;
    if (value && typeof value[Symbol.asyncIterator] === "function") await collect(value);
    return { status: 200 };
  } catch (e) {
    return { status: e.status ?? null, error: e.error ?? null, message: String(e.message) };
  }
}

// Schemas for the structured output check: their values are short (bounded strings, arrays and
// numbers, enums), so random weights finish them well within max_tokens.
const structured_schemas = [
  { name: "person", schema: {
    type: "object", additionalProperties: false, required: ["name", "age", "role", "tags"],
    properties: {
      name: { type: "string", minLength: 1, maxLength: 6 },
      age: { type: "integer", minimum: 0, maximum: 120 },
      role: { enum: ["admin", "user", "guest", null] },
      score: { type: "number", exclusiveMinimum: 0, maximum: 1 },
      tags: { type: "array", items: { type: "string", maxLength: 3 }, maxItems: 2 },
      active: { type: "boolean" },
    } } },
  { name: "tree", schema: {
    $defs: { node: { type: "object", additionalProperties: false, required: ["v", "kids"], properties: {
      v: { type: "integer", minimum: -9, maximum: 9 },
      kids: { type: "array", maxItems: 2, items: { $ref: "#/$defs/node" } } } } },
    $ref: "#/$defs/node" } },
  { name: "choice", schema: {
    anyOf: [{ type: "object", additionalProperties: false, required: ["kind", "n"],
              properties: { kind: { const: "count" }, n: { type: "integer", minimum: 1, maximum: 99 } } },
            { type: "array", minItems: 1, maxItems: 3, items: { type: ["boolean", "null"] } }] } },
];

const checks = {
  // response_format json_schema: each reply that finishes is valid for its schema (ajv, an independent
  // validator), streamed equals non-streamed, the SDK's parse() reads the reply, and what the
  // server cannot hold output to is refused.
  async structured() {
    const ajv = new Ajv({ strict: false });
    const results = [];
    for (const { name, schema } of structured_schemas) {
      const validate = ajv.compile(schema);
      for (let seed = 0; seed < 3; ++seed) {
        const request = {
          model, temperature: 1, seed, max_tokens: 400,
          messages: [{ role: "user", content: `Give me a ${name} as JSON.` }],
          response_format: { type: "json_schema", json_schema: { name, schema, strict: true } },
        };
        const reply = await client.chat.completions.create(request);
        const streamed = chat_from_chunks(await collect(await client.chat.completions.create({ ...request, stream: true })));
        const choice = reply.choices[0];
        let valid = null;
        if (choice.finish_reason === "stop") {
          try { valid = validate(JSON.parse(choice.message.content)); } catch { valid = false; }
        }
        results.push({ name, seed, finish_reason: choice.finish_reason, content: choice.message.content, valid,
                       errors: validate.errors ?? null, streamed_content: streamed.content });
      }
    }
    const point = { type: "object", additionalProperties: false, required: ["x", "up"],
                    properties: { x: { type: "integer", minimum: 0, maximum: 9 }, up: { type: "boolean" } } };
    const parsed = await client.chat.completions.parse({
      ...greedy, max_tokens: 200, messages: [{ role: "user", content: "A point, please." }],
      response_format: { type: "json_schema", json_schema: { name: "point", schema: point, strict: true } },
    });
    const completion = await client.completions.create({
      ...greedy, prompt: "A point:", max_tokens: 200,
      response_format: { type: "json_schema", json_schema: { name: "point", schema: point } },
    });
    // Text in a JSON string that spells Gemma's markers stays text: the chat answer is not parsed.
    const markers = await client.chat.completions.create({
      ...greedy, max_tokens: 200, messages: [{ role: "user", content: "Hi" }],
      response_format: { type: "json_schema", json_schema: { name: "m", schema: {
        const: "a<turn|>b<|channel>thought\nc<channel|>d<|tool_call>call:f{}<tool_call|>" } } },
    });
    const refused = await api_error(client.chat.completions.create({
      ...greedy, max_tokens: 8, messages: [{ role: "user", content: "Hi" }],
      response_format: { type: "json_schema", json_schema: { name: "code", schema: { type: "string", pattern: "^[A-Z]{3}$" } } },
    }));
    // tool_choice "required" and a named function: the reply is calls, each call's arguments valid for
    // its function's parameters.
    const tools = [
      { type: "function", function: { name: "get_weather", parameters: {
        type: "object", required: ["city", "unit"], properties: {
          city: { type: "string", maxLength: 8 }, unit: { enum: ["celsius", "fahrenheit"] },
          days: { type: "integer", minimum: 1, maximum: 7 } } } } },
      { type: "function", function: { name: "lookup", parameters: {
        type: "object", required: ["ids"], properties: {
          ids: { type: "array", maxItems: 3, items: { type: "integer", minimum: 0, maximum: 99 } },
          exact: { type: "boolean" } } } } },
    ];
    const forced = [];
    for (const tool_choice of ["required", { type: "function", function: { name: "lookup" } }]) {
      for (let seed = 0; seed < 3; ++seed) {
        const request = { model, temperature: 1, seed, max_tokens: 400, tools, tool_choice,
                          messages: [{ role: "user", content: "What is the weather in Oslo?" }] };
        const reply = await client.chat.completions.create(request);
        const streamed = chat_from_chunks(await collect(await client.chat.completions.create({ ...request, stream: true })));
        const choice = reply.choices[0];
        const calls = (choice.message.tool_calls ?? []).map((call) => {
          const tool = tools.find((t) => t.function.name === call.function.name);
          let valid = false;
          try { valid = !!tool && ajv.validate(tool.function.parameters, JSON.parse(call.function.arguments)); } catch {}
          return { name: call.function.name, arguments: call.function.arguments, valid };
        });
        forced.push({ tool_choice, seed, finish_reason: choice.finish_reason, content: choice.message.content, calls,
                      streamed_names: streamed.tool_calls.filter((t) => t.function?.name).map((t) => t.function.name) });
      }
    }
    return {
      results, forced, parsed: parsed.choices[0].message.parsed, parsed_content: parsed.choices[0].message.content,
      completion: completion.choices[0], completion_valid: ajv.validate(point, JSON.parse(completion.choices[0].text)),
      refused, markers: markers.choices[0].message,
    };
  },

  async chat() {
    const messages = [
      { role: "system", content: "You are terse." },
      { role: "user", content: "Write a short poem about the sea, with émojis 🌊 and ünïcode." },
    ];
    const full = await client.chat.completions.create({ ...greedy, messages, max_tokens: 24 });
    const chunks = await collect(await client.chat.completions.create({
      ...greedy, messages, max_tokens: 24, stream: true, stream_options: { include_usage: true },
    }));
    const streamed = chat_from_chunks(chunks);
    const by_new_name = await client.chat.completions.create({ ...greedy, messages, max_completion_tokens: 5 });
    const with_logprobs = await client.chat.completions.create({
      ...greedy, messages, max_tokens: 4, logprobs: true, top_logprobs: 3,
    });
    const stream_without_usage = await collect(await client.chat.completions.create({
      ...greedy, messages, max_tokens: 3, stream: true,
    }));
    return {
      full, streamed,
      first_chunk: chunks[0],
      last_chunks: chunks.slice(-2),
      chunk_ids: [...new Set(chunks.map((c) => c.id))],
      chunk_objects: [...new Set(chunks.map((c) => c.object))],
      by_new_name, with_logprobs,
      without_usage: { usage_fields: stream_without_usage.map((c) => c.usage ?? null), count: stream_without_usage.length },
    };
  },

  async stop() {
    const messages = [{ role: "user", content: "Count to twenty." }];
    const prompt = "Once upon a time";
    const chat_full = (await client.chat.completions.create({ ...greedy, messages, max_tokens: 24 })).choices[0].message.content;
    const text_full = (await client.completions.create({ ...greedy, prompt, max_tokens: 24, skip_special_tokens: false })).choices[0].text;
    // A stop string from the middle of the greedy answer: the answer must end right before its first occurrence.
    const pick = (text) => [...text].slice(Math.floor([...text].length / 2), Math.floor([...text].length / 2) + 2).join("");
    const chat_stop = pick(chat_full), text_stop = pick(text_full);
    const chat_stopped = await client.chat.completions.create({ ...greedy, messages, max_tokens: 24, stop: [chat_stop, "never-appears-xyz"] });
    const chat_streamed = chat_from_chunks(await collect(await client.chat.completions.create({
      ...greedy, messages, max_tokens: 24, stop: chat_stop, stream: true,
    })));
    const text_stopped = await client.completions.create({ ...greedy, prompt, max_tokens: 24, stop: text_stop, skip_special_tokens: false });
    const text_chunks = await collect(await client.completions.create({
      ...greedy, prompt, max_tokens: 24, stop: text_stop, stream: true, skip_special_tokens: false,
    }));
    return {
      chat_full, chat_stop, chat_stopped: chat_stopped.choices[0], chat_streamed,
      text_full, text_stop, text_stopped: text_stopped.choices[0],
      text_streamed: text_chunks.map((c) => c.choices[0]?.text ?? "").join(""),
      text_stream_finish: text_chunks.at(-1).choices[0]?.finish_reason,
    };
  },

  async seed() {
    const messages = [{ role: "user", content: "Tell me something." }];
    const run = async (params) => (await client.chat.completions.create({ model, messages, max_tokens: 16, ...params })).choices[0].message.content;
    return {
      a: await run({ temperature: 1, seed: 1234 }),
      b: await run({ temperature: 1, seed: 1234 }),
      c: await run({ temperature: 1, seed: 99 }),
      defaults_a: await run({ seed: 7 }),
      defaults_b: await run({ seed: 7 }),
    };
  },

  async tools() {
    const tools = [{
      type: "function",
      function: {
        name: "get_weather",
        description: "Current weather in a city",
        parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
      },
    }];
    const messages = [{ role: "user", content: "What is the weather in Paris?" }];
    const ask = (extra) => client.chat.completions.create({ ...greedy, messages, max_tokens: 12, ...extra });
    const plain = await ask({});
    const auto = await ask({ tools });
    const none = await ask({ tools, tool_choice: "none" });
    const required = await ask({ tools, tool_choice: "required" });
    const named = await ask({ tools, tool_choice: { type: "function", function: { name: "get_weather" } } });
    const streamed = chat_from_chunks(await collect(await client.chat.completions.create({
      ...greedy, messages, max_tokens: 12, tools, stream: true,
    })));
    // A conversation that already went through a tool call and its result.
    const followup = await client.chat.completions.create({
      ...greedy, max_tokens: 8, tools,
      messages: [
        ...messages,
        { role: "assistant", content: null, tool_calls: [{ id: "call_1", type: "function", function: { name: "get_weather", arguments: "{\"city\":\"Paris\"}" } }] },
        { role: "tool", tool_call_id: "call_1", content: "sunny, 21 C" },
      ],
    });
    const thinking = await client.chat.completions.create({
      ...greedy, messages, max_tokens: 8, chat_template_kwargs: { enable_thinking: true },
    });
    const summary = (r) => ({ finish_reason: r.choices[0].finish_reason, message: r.choices[0].message, usage: r.usage });
    return {
      plain: summary(plain), auto: summary(auto), none: summary(none), required: summary(required),
      named: summary(named), streamed, followup: summary(followup), thinking: summary(thinking),
    };
  },

  async completions() {
    const prompt = "The quick brown fox";
    const full = await client.completions.create({ ...greedy, prompt, max_tokens: 12 });
    const chunks = await collect(await client.completions.create({
      ...greedy, prompt, max_tokens: 12, stream: true, stream_options: { include_usage: true },
    }));
    const tokens = (await (await fetch(`${baseURL}/tokenize`, { method: "POST", body: JSON.stringify({ prompt }) })).json()).tokens;
    const by_ids = await client.completions.create({ ...greedy, prompt: tokens, max_tokens: 12 });
    const list_of_one = await client.completions.create({ ...greedy, prompt: [prompt], max_tokens: 12 });
    const echoed = await client.completions.create({ ...greedy, prompt, max_tokens: 12, echo: true });
    const logprobs = await client.completions.create({ ...greedy, prompt, max_tokens: 3, logprobs: 2 });
    const sampled_logprobs = await client.completions.create({ prompt, max_tokens: 12, logprobs: 1, temperature: 1, seed: 7 });
    const defaulted = await client.completions.create({ ...greedy, prompt });
    return {
      full, streamed: chunks.map((c) => c.choices[0]?.text ?? "").join(""),
      stream_finish: chunks.at(-2)?.choices[0]?.finish_reason, stream_usage: chunks.at(-1).usage,
      stream_objects: [...new Set(chunks.map((c) => c.object))],
      by_ids, list_of_one, echoed, logprobs, sampled_logprobs, defaulted,
    };
  },

  // n choices of one chat prompt, and a batch of completion prompts with n each.
  async choices() {
    const messages = [{ role: "user", content: "Name a colour." }];
    const sampled = { model, messages, max_tokens: 10, temperature: 1, seed: 40, n: 3 };
    const many = await client.chat.completions.create(sampled);
    const many_again = await client.chat.completions.create(sampled);
    const many_streamed = await collect(await client.chat.completions.create({
      ...sampled, stream: true, stream_options: { include_usage: true },
    }));
    const greedy_chat = await client.chat.completions.create({ ...greedy, messages, max_tokens: 10, n: 2 });
    const greedy_alone = await client.chat.completions.create({ ...greedy, messages, max_tokens: 10 });
    const prompts = ["Once upon a time", [2, 818, 5279, 529]];
    const batch = await client.completions.create({ ...greedy, prompt: prompts, n: 2, max_tokens: 8, echo: true });
    const batch_alone = [];
    for (const prompt of prompts) batch_alone.push(await client.completions.create({ ...greedy, prompt, max_tokens: 8, echo: true }));
    const batch_chunks = await collect(await client.completions.create({
      ...greedy, prompt: prompts, n: 2, max_tokens: 8, stream: true, stream_options: { include_usage: true },
    }));
    return {
      many, many_again, many_streamed: choices_from_chunks(many_streamed), many_streamed_usage: many_streamed.at(-1).usage,
      many_streamed_roles: many_streamed.filter((c) => c.choices[0]?.delta?.role).map((c) => c.choices[0].index),
      greedy_chat, greedy_alone, batch, batch_alone,
      batch_streamed: choices_from_chunks(batch_chunks), batch_streamed_usage: batch_chunks.at(-1).usage,
      too_many: await api_error(client.completions.create({ model, prompt: Array(65).fill("a"), n: 2, max_tokens: 1 })),
      best_of_above_n: await api_error(client.completions.create({ model, prompt: "a", n: 2, best_of: 3, max_tokens: 1 })),
      mixed_batch: await api_error(client.completions.create({ model, prompt: ["a", 5], max_tokens: 1 })),
      second_prompt_bad: await api_error(client.completions.create({ model, prompt: ["a", [2, 99999999]], max_tokens: 40 })),
      after: await client.completions.create({ ...greedy, prompt: "a", max_tokens: 1 }),
    };
  },

  async errors() {
    const user = [{ role: "user", content: "hi" }];
    const chat = (params) => api_error(client.chat.completions.create({ model, messages: user, max_tokens: 2, ...params }));
    return {
      messages_not_list: await chat({ messages: "hello" }),
      messages_empty: await chat({ messages: [] }),
      unknown_role: await chat({ messages: [{ role: "wizard", content: "x" }] }),
      temperature_string: await chat({ temperature: "hot" }),
      temperature_negative: await chat({ temperature: -0.5 }),
      temperature_too_high: await chat({ temperature: 2.5 }),
      top_p_zero: await chat({ top_p: 0 }),
      top_p_above_one: await chat({ top_p: 1.5 }),
      max_tokens_negative: await chat({ max_tokens: -1 }),
      max_tokens_huge: await chat({ max_tokens: 100_000_000 }),
      n_zero: await chat({ n: 0 }),
      too_many_stops: await chat({ stop: ["a", "b", "c", "d", "e"] }),
      top_logprobs_without_logprobs: await chat({ top_logprobs: 2 }),
      unknown_model: await chat({ model: "no-such-model" }),
      bad_tool_choice: await chat({ tool_choice: "sometimes" }),
      stream_error: await chat({ stream: true, temperature: 5 }),
      completion_no_prompt: await api_error(client.completions.create({ model, max_tokens: 2 })),
      completion_bad_token: await api_error(client.completions.create({ model, prompt: [1, 2, 99999999], max_tokens: 2 })),
      completion_batch_empty_prompt: await api_error(client.completions.create({ model, prompt: ["a", ""], max_tokens: 2 })),
      still_works: await chat({ temperature: 0 }),
    };
  },

  // 16 simultaneous streams with mixed prompt lengths and lengths; every third one is aborted after a
  // few chunks. The others must finish and equal the same requests run alone.
  async concurrency() {
    const words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split(" ");
    const requests = Array.from({ length: 16 }, (_, i) => ({
      index: i,
      cancel: i % 3 === 0,
      messages: [{ role: "user", content: Array.from({ length: 1 + ((i * 7) % 40) }, (_, k) => words[(i + k) % words.length]).join(" ") }],
      max_tokens: 6 + ((i * 5) % 23),
    }));
    const run_stream = async (r) => {
      const stream = await client.chat.completions.create({
        ...greedy, messages: r.messages, max_tokens: r.max_tokens, stream: true, stream_options: { include_usage: true },
      });
      const chunks = [];
      try {
        for await (const chunk of stream) {
          chunks.push(chunk);
          if (r.cancel && chunks.length >= 3) {
            stream.controller.abort();
            break;
          }
        }
      } catch (e) {
        if (!r.cancel) throw e;
      }
      return { index: r.index, cancelled: r.cancel, ...chat_from_chunks(chunks) };
    };
    const together = await Promise.all(requests.map(run_stream));
    const alone = [];
    for (const r of requests.filter((r) => !r.cancel)) {
      const res = await client.chat.completions.create({ ...greedy, messages: r.messages, max_tokens: r.max_tokens });
      alone.push({ index: r.index, content: res.choices[0].message.content ?? "", finish_reason: res.choices[0].finish_reason, usage: res.usage });
    }
    // The engine frees cancelled sequences at its next step; give it a moment to report that.
    let metrics = "";
    for (let attempt = 0; attempt < 50; ++attempt) {
      metrics = await (await fetch(`${baseURL}/metrics`)).text();
      if (/^vllm:num_requests_running\{[^}]*\} 0$/m.test(metrics) && /^vllm:kv_cache_usage_perc\{[^}]*\} 0$/m.test(metrics)) break;
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
    const gauge = (name) => Number((metrics.match(new RegExp(`^${name}\\{[^}]*\\} (\\S+)$`, "m")) ?? [])[1]);
    return {
      together, alone,
      running: gauge("vllm:num_requests_running"),
      waiting: gauge("vllm:num_requests_waiting"),
      kv_usage: gauge("vllm:kv_cache_usage_perc"),
      aborted: Number((metrics.match(/^vllm:request_success_total\{finished_reason="abort"[^}]*\} (\S+)$/m) ?? [])[1]),
    };
  },

  async auth() {
    const key = args[0];
    const wrong = new OpenAI({ baseURL: `${baseURL}/v1`, apiKey: "wrong-key", maxRetries: 0 });
    const right = new OpenAI({ baseURL: `${baseURL}/v1`, apiKey: key, maxRetries: 0 });
    return {
      wrong: await api_error(wrong.models.list()),
      right_models: (await right.models.list()).data.map((m) => m.id),
      right_chat: (await right.chat.completions.create({ ...greedy, messages: [{ role: "user", content: "hi" }], max_tokens: 2 })).choices[0].finish_reason,
    };
  },

  // Many long requests at once against a server with a tiny queue: some must be refused with 429.
  async flood() {
    const n = Number(args[0] ?? 8), max_tokens = Number(args[1] ?? 2000);
    const controller = new AbortController();
    const results = await Promise.all(Array.from({ length: n }, async () => {
      try {
        const stream = await client.chat.completions.create(
          { ...greedy, messages: [{ role: "user", content: "go" }], max_tokens, stream: true },
          { signal: controller.signal });
        // Accepted: hold the slot a moment so the others pile up, then let go.
        await new Promise((resolve) => setTimeout(resolve, 1500));
        stream.controller.abort();
        return { status: 200 };
      } catch (e) {
        return { status: e.status ?? null, error: e.error ?? null };
      }
    }));
    return { results };
  },
};

if (!checks[check]) {
  console.error(`unknown check '${check}' (known: ${Object.keys(checks).join(", ")})`);
  process.exit(2);
}
try {
  console.log(JSON.stringify(await checks[check]()));
} catch (e) {
  console.error(`check '${check}' failed: ${e.stack ?? e}`);
  if (e.error) console.error(JSON.stringify(e.error));
  process.exit(1);
}
