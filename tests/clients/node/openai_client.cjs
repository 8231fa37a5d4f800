// The official `openai` npm package against Engram: create, stream and .withResponse(),
// memory controls as its users send them (extra body fields, and request headers).
//
// Run by tests/clients/test_client_matrix.py with NODE_PATH pointing at the cached
// `npm ci` of package-lock.json: `node openai_client.cjs '<json>'`. The argument names
// the gateway, model, user, conversation and question; one JSON object with what each
// call returned goes to stdout.
"use strict";

const OpenAI = require("openai");
const { VERSION: version } = require("openai/version");

async function main(config) {
  const client = new OpenAI({ baseURL: config.base_url, apiKey: "sk-matrix", maxRetries: 0 });
  const params = {
    model: config.model,
    messages: [{ role: "user", content: config.question }],
    user: config.user,
    memory_id: config.conversation, // not in the SDK's types; sent as is
  };

  const completion = await client.chat.completions.create(params);

  const stream = await client.chat.completions.create({ ...params, stream: true });
  let streamed = "";
  let firstChunkHits = null;
  for await (const chunk of stream) {
    if (firstChunkHits === null) firstChunkHits = chunk.memory_hits ?? [];
    streamed += chunk.choices[0]?.delta?.content ?? "";
  }

  const { data, response } = await client.chat.completions
    .create(params, { headers: { "X-Engram-Memory-Top-K": "3" } })
    .withResponse();

  return {
    version,
    create: {
      text: completion.choices[0].message.content,
      memory_hits: (completion.memory_hits ?? []).map((hit) => hit.text),
    },
    stream: { text: streamed, first_chunk_hits: firstChunkHits.map((hit) => hit.text) },
    with_response: {
      text: data.choices[0].message.content,
      status: response.status,
      request_id: response.headers.get("x-request-id"),
      memory: response.headers.get("x-engram-memory"),
    },
  };
}

main(JSON.parse(process.argv[2]))
  .then((result) => console.log(JSON.stringify(result)))
  .catch((error) => {
    console.error(error);
    process.exit(1);
  });
