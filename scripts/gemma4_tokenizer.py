#!/usr/bin/python3
"""Builds a Gemma 4 tokenizer.json from Google's Gemma 3 tokenizer.json.

    /usr/bin/python3 scripts/gemma4_tokenizer.py IN_GEMMA3_TOKENIZER_JSON OUT_JSON

Gemma 4 keeps Gemma 3's vocabulary and BPE merges but gives some control tokens new names (see
docs/tokenizer.md and ../shared/docs/gemma4-text-model.md section 4.1). This script renames them in
both places a token is spelled, model.vocab and added_tokens, marks them special, and drops Gemma 3's
<image_soft_token> (id 262144), which lies past Gemma 4's 262144-id vocabulary. Nothing else
changes, so every other text tokenizes exactly as before. Python standard library only.
"""
import json
import sys

# id -> Gemma 4 spelling. The Gemma 3 spellings are <start_of_turn>, <end_of_turn>, <unusedN>,
# <start_of_image> and <end_of_image>.
GEMMA4_NAMES = {
    46: "<|tool>",
    47: "<tool|>",
    48: "<|tool_call>",
    49: "<tool_call|>",
    50: "<|tool_response>",
    51: "<tool_response|>",
    52: '<|"|>',
    98: "<|think|>",
    100: "<|channel>",
    101: "<channel|>",
    105: "<|turn>",
    106: "<turn|>",
    255999: "<|image>",
    256000: "<|audio>",
    258880: "<|image|>",
    258881: "<|audio|>",
    258882: "<image|>",
    258883: "<audio|>",
    258884: "<|video|>",
}
GEMMA4_VOCAB_SIZE = 262144


def fail(message):
    sys.exit(f"gemma4_tokenizer.py: {message}")


def convert(tokenizer):
    model = tokenizer.get("model") or fail("the input has no model")
    vocab = model.get("vocab") or fail("the input has no model.vocab")
    by_id = {token_id: token for token, token_id in vocab.items()}
    renamed = {}
    for token_id, new_name in GEMMA4_NAMES.items():
        old_name = by_id.get(token_id) or fail(f"id {token_id} is not in the vocabulary")
        if new_name in vocab:
            fail(f"{new_name!r} is already in the vocabulary: is the input Gemma 4 already?")
        renamed[old_name] = new_name

    # Rebuilt rather than edited so that the vocabulary keeps its order.
    model["vocab"] = {renamed.get(token, token): token_id for token, token_id in vocab.items()}

    # Merges never involve control tokens; refuse rather than produce an inconsistent file.
    for merge in model.get("merges", []):
        parts = merge.split(" ") if isinstance(merge, str) else merge
        for part in parts:
            if part in renamed:
                fail(f"merge {merge!r} uses the renamed token {part!r}")

    added = []
    for entry in tokenizer.get("added_tokens", []):
        if entry["id"] >= GEMMA4_VOCAB_SIZE:
            continue  # <image_soft_token>: Gemma 4 has no id past 262143
        if entry["id"] in GEMMA4_NAMES:
            if entry["content"] != by_id[entry["id"]]:
                fail(f"added token {entry['id']} disagrees with the vocabulary")
            entry = dict(entry, content=GEMMA4_NAMES[entry["id"]], special=True)
        added.append(entry)
    tokenizer["added_tokens"] = added
    return tokenizer


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    source, target = sys.argv[1], sys.argv[2]
    try:
        with open(source, encoding="utf-8") as f:
            tokenizer = json.load(f)
    except (OSError, ValueError) as e:
        fail(f"cannot read {source}: {e}")
    tokenizer = convert(tokenizer)
    with open(target, "w", encoding="utf-8") as f:
        json.dump(tokenizer, f, ensure_ascii=False, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
