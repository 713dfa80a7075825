#!/usr/bin/env python3
"""Renders chat cases with Python Jinja2 the way transformers' apply_chat_template does (a sandboxed
environment with trim_blocks and lstrip_blocks). The second peer of Tandem's chat renderer, used for
the cases where @huggingface/jinja and Python disagree (docs/chat-format.md, "Choices").

    python3 render_chat_template.py TEMPLATE.jinja CASES.json

Prints a JSON array: one rendered string per case, or {"error": MESSAGE}."""
import json
import sys

from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment


def raise_exception(message):
    raise TemplateError(message)


def main():
    template_path, cases_path = sys.argv[1:3]
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = raise_exception
    with open(template_path, encoding="utf-8") as f:
        template = env.from_string(f.read())
    with open(cases_path, encoding="utf-8") as f:
        cases = json.load(f)
    results = []
    for case in cases:
        variables = {
            "messages": case["messages"],
            "add_generation_prompt": case.get("add_generation_prompt", True),
            "bos_token": case.get("bos_token", "<bos>"),
            "eos_token": "<eos>",
        }
        for key in ("tools", "enable_thinking", "preserve_thinking"):
            if key in case:
                variables[key] = case[key]
        try:
            results.append(template.render(**variables))
        except Exception as error:  # one bad case must not hide the others
            results.append({"error": f"{type(error).__name__}: {error}"})
    json.dump(results, sys.stdout, indent=1, ensure_ascii=False)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
