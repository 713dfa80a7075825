// The chunks of an OpenAI-style Server-Sent Events response, parsed, as they arrive (`data: [DONE]`
// and non-data lines left out); an `error` event throws.
export async function* sse_chunks(response) {
  const decoder = new TextDecoder();
  let buffer = "";
  for await (const bytes of response.body) {
    buffer += decoder.decode(bytes, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end).trim();
      buffer = buffer.slice(end + 2);
      if (!event.startsWith("data: ") || event === "data: [DONE]") continue;
      const chunk = JSON.parse(event.slice(6));
      if (chunk.error) throw new Error(JSON.stringify(chunk.error));
      yield chunk;
    }
  }
}
