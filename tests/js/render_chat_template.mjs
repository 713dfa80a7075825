// Renders chat cases with @huggingface/jinja, the peer implementation Tandem's chat renderer is
// tested against (src/tokenizer/chat_format.h).
//
//   node render_chat_template.mjs TEMPLATE.jinja CASES.json
//
// CASES.json is an array of {messages, tools?, add_generation_prompt?, enable_thinking?,
// preserve_thinking?, bos_token?}. Prints a JSON array with one entry per case: the rendered string,
// or {"error": MESSAGE} when the template refused the case (so one bad case never hides the others).
import { readFileSync } from "node:fs";
import { Template } from "@huggingface/jinja";

const [templatePath, casesPath] = process.argv.slice(2);
if (!templatePath || !casesPath) {
  console.error("usage: node render_chat_template.mjs TEMPLATE.jinja CASES.json");
  process.exit(2);
}

const template = new Template(readFileSync(templatePath, "utf8"));
const cases = JSON.parse(readFileSync(casesPath, "utf8"));

// The variables transformers' apply_chat_template passes, with the same defaults as ChatOptions.
function render(chatCase) {
  const variables = {
    messages: chatCase.messages,
    add_generation_prompt: chatCase.add_generation_prompt ?? true,
    bos_token: chatCase.bos_token ?? "<bos>",
    eos_token: "<eos>",
    // raise_exception is a global of @huggingface/jinja already (it throws, as transformers' does).
  };
  if (chatCase.tools !== undefined) variables.tools = chatCase.tools;
  if (chatCase.enable_thinking !== undefined) variables.enable_thinking = chatCase.enable_thinking;
  if (chatCase.preserve_thinking !== undefined) variables.preserve_thinking = chatCase.preserve_thinking;
  try {
    return template.render(variables);
  } catch (error) {
    return { error: String(error?.message ?? error) };
  }
}

process.stdout.write(JSON.stringify(cases.map(render), null, 1) + "\n");
