// Chat completions through shaper's proxy with the openai package,
// unchanged: the SDK's apiKey is the shaper key and its baseURL the proxy.
// Retries are off, so every answer is shaper's first.
//
//   SHAPER_BASE_URL=http://HOST:PORT/proxy/openai/v1 SHAPER_KEY=... \
//     node openai.mjs chat|stream|stream-usage [CALLS]
//
// SHAPER_MAX_WAIT, when set, is sent as Shaper-Max-Wait on every call.
// stream-usage streams with stream_options.include_usage and max_tokens
// SHAPER_MAX_TOKENS, one call after another, and prints total_tokens,
// the usage of the last chunk.
// Prints one JSON line per call, in the order they finish: {i, ok, text,
// ms, queue_time} and, streamed, chunk_ms (when each chunk arrived, in ms
// from the call's start); a refused call {i, ok: false, status, error,
// retry_after, retry_after_ms, ms}.
import OpenAI from "openai";

const mode = process.argv[2] ?? "chat";
const calls = Number(process.argv[3] ?? 1);
const headers = {};
if (process.env.SHAPER_MAX_WAIT) headers["Shaper-Max-Wait"] = process.env.SHAPER_MAX_WAIT;

const client = new OpenAI({
  apiKey: process.env.SHAPER_KEY,
  baseURL: process.env.SHAPER_BASE_URL,
  maxRetries: 0,
  defaultHeaders: headers,
});

function header(h, name) {
  if (!h) return null;
  return typeof h.get === "function" ? h.get(name) : (h[name] ?? null);
}

async function call(i) {
  const start = performance.now();
  const ms = () => Math.round(performance.now() - start);
  const params = { model: "gpt-4o-mini", messages: [{ role: "user", content: `call ${i}` }] };
  try {
    if (mode === "stream" || mode === "stream-usage") {
      const extra = mode === "stream-usage"
        ? { stream_options: { include_usage: true }, max_tokens: Number(process.env.SHAPER_MAX_TOKENS) }
        : {};
      const { data: stream, response } = await client.chat.completions
        .create({ ...params, ...extra, stream: true })
        .withResponse();
      const chunkMs = [];
      let text = "";
      let totalTokens = null;
      for await (const chunk of stream) {
        chunkMs.push(ms());
        text += chunk.choices[0]?.delta?.content ?? "";
        if (chunk.usage) totalTokens = chunk.usage.total_tokens;
      }
      return { i, ok: true, text, chunk_ms: chunkMs, ms: ms(), total_tokens: totalTokens, queue_time: header(response.headers, "shaper-queue-time") };
    }
    const { data, response } = await client.chat.completions.create(params).withResponse();
    return { i, ok: true, text: data.choices[0].message.content, ms: ms(), queue_time: header(response.headers, "shaper-queue-time") };
  } catch (err) {
    if (!(err instanceof OpenAI.APIError)) throw err;
    return {
      i, ok: false, status: err.status ?? 0, error: err.constructor.name, message: err.message,
      retry_after: header(err.headers, "retry-after"),
      retry_after_ms: header(err.headers, "retry-after-ms"),
      ms: ms(),
    };
  }
}

if (mode === "stream-usage") {
  for (let i = 0; i < calls; i++) console.log(JSON.stringify(await call(i)));
} else {
  await Promise.all(Array.from({ length: calls }, (_, i) => call(i).then((r) => console.log(JSON.stringify(r)))));
}
