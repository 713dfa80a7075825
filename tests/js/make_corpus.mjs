// Deterministic multilingual test corpus for the tokenizer tests and benchmark.
//
//   node make_corpus.mjs [--seed N] [--kb SIZE] OUT.json
//
// Writes a JSON array of documents (strings) of about SIZE kilobytes in all. The same seed always
// gives the same corpus, so a mismatch found once can be found again. Documents mix many scripts,
// source code, emoji and ZWJ sequences, whitespace runs, control characters, the literal text of
// special tokens, and characters that the Gemma vocabulary lacks (byte fallback).
import { writeFileSync } from "node:fs";

const args = process.argv.slice(2);
let seed = 1;
let kilobytes = 1024;
let out = null;
for (let i = 0; i < args.length; ++i) {
  if (args[i] === "--seed") seed = Number(args[++i]);
  else if (args[i] === "--kb") kilobytes = Number(args[++i]);
  else out = args[i];
}
if (!out || !Number.isFinite(seed) || !Number.isFinite(kilobytes)) {
  console.error("usage: node make_corpus.mjs [--seed N] [--kb SIZE] OUT.json");
  process.exit(2);
}

// mulberry32: small, fast and identical on every platform.
let state = seed >>> 0;
function random() {
  state = (state + 0x6d2b79f5) >>> 0;
  let t = state;
  t = Math.imul(t ^ (t >>> 15), t | 1);
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const int = (n) => Math.floor(random() * n);
const pick = (list) => list[int(list.length)];
const chance = (p) => random() < p;

const PROSE = {
  english: "The quick brown fox jumps over the lazy dog. It was the best of times, it was the worst of times. Tokenizers split text into pieces that a language model can read; numbers like 3.14159, 2,048 and 1e-9 appear too. Don't forget: we're here, they'll come, it's fine.",
  french: "Le cœur a ses raisons que la raison ne connaît point. Où est la bibliothèque ? Ça coûte dix-huit euros, s'il vous plaît. L'été dernier, nous sommes allés à Québec.",
  german: "Die Würde des Menschen ist unantastbar. Größere Straßen führen über Brücken nach Köln. Donaudampfschifffahrtsgesellschaftskapitän ist ein langes Wort.",
  spanish: "¿Dónde está la estación? ¡Qué día tan bonito! El niño comió piña y jalapeños en la mañana.",
  polish: "Zażółć gęślą jaźń. Chrząszcz brzmi w trzcinie w Szczebrzeszynie.",
  vietnamese: "Tiếng Việt có nhiều dấu thanh: sắc, huyền, hỏi, ngã, nặng. Tôi yêu Hà Nội và thành phố Hồ Chí Minh.",
  turkish: "Çok güzel bir gün; İstanbul'da ılık bir rüzgâr esiyor. Şişli'de ağaçlar yeşillendi.",
  russian: "Съешь же ещё этих мягких французских булок, да выпей чаю. В чащах юга жил бы цитрус? Да, но фальшивый экземпляр!",
  ukrainian: "Чуєш їх, доцю, га? Кумедна ж ти, прощайся без ґольфів! Їжак ґедзь фотографує.",
  greek: "Ξεσκεπάζω την ψυχοφθόρα βδελυγμία. Η γλώσσα μου έδωσαν ελληνική· το σπίτι φτωχικό στις αμμουδιές του Ομήρου.",
  arabic: "نص حكيم له سر قاطع وذو شأن عظيم مكتوب على ثوب أخضر ومغلف بجلد أزرق. اللغة العربية جميلة جداً.",
  hebrew: "דג סקרן שט בים מאוכזב ולפתע מצא חברה. עברית נכתבת מימין לשמאל.",
  persian: "زبان فارسی یکی از زبان‌های هندواروپایی است. کتاب‌ها روی میز هستند.",
  hindi: "ऋषियों को सताने वाले दुष्ट राक्षसों के राजा रावण का सर्वनाश करने वाले विष्णुवतार भगवान श्रीराम। हिन्दी भाषा देवनागरी लिपि में लिखी जाती है।",
  bengali: "আমার সোনার বাংলা, আমি তোমায় ভালোবাসি। চিরদিন তোমার আকাশ, তোমার বাতাস।",
  tamil: "யாமறிந்த மொழிகளிலே தமிழ்மொழி போல் இனிதாவது எங்கும் காணோம்.",
  thai: "เป็นมนุษย์สุดประเสริฐเลิศคุณค่า กว่าบรรดาฝูงสัตว์เดรัจฉาน ภาษาไทยไม่มีการเว้นวรรคระหว่างคำ",
  chinese: "我能吞下玻璃而不伤身体。中文没有空格，分词器必须处理很长的句子。繁體中文與簡體中文都應該正確編碼。",
  japanese: "いろはにほへと ちりぬるを わかよたれそ つねならむ。日本語の文章はひらがな、カタカナ、漢字を混ぜて書きます。東京タワーは高い。",
  korean: "다람쥐 헌 쳇바퀴에 타고파. 한국어는 한글로 씁니다. 키스의 고유조건은 입술끼리 만나야 하고 특별한 기술은 필요치 않다.",
  georgian: "მინდა ვისწავლო ქართული ენა. საქართველო ლამაზი ქვეყანაა.",
  armenian: "Բարեւ ձեզ, ինչպե՞ս եք։ Հայերենը ունի իր այբուբենը։",
  amharic: "ሰማይ አይታረስ ንጉሥ አይከሰስ። አማርኛ በግዕዝ ፊደል ይጻፋል።",
  khmer: "ខ្ញុំអាចញ៉ាំកញ្ចក់បាន ដោយគ្មានបញ្ហា",
  sinhala: "මට වීදුරු කෑමට හැකියි. එයින් මට කිසි හානියක් සිදු නොවේ.",
  mongolian: "ᠮᠣᠩᠭᠣᠯ ᠬᠡᠯᠡ Монгол хэл кирилл үсгээр бичигддэг.",
  math: "∀x∈ℝ: ⌈x⌉ = −⌊−x⌋, ∑ᵢ₌₁ⁿ i = n(n+1)/2, √2 ≈ 1.41421, ∞ ≠ ∅, α→β ⇒ γ ⊆ Δ, 𝔽ₚ and 𝒪(n log n).",
};

const CODE = [
  "#include <vector>\n\nint main(int argc, char** argv) {\n\tstd::vector<int> v{1, 2, 3};\n\tfor (auto& x : v) x *= 2;  // double\n\treturn v.size() > 2 ? 0 : 1;\n}\n",
  "def fib(n: int) -> int:\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n\nprint(f\"{fib(30):,}\")\n",
  "const greet = async (name) => {\n  const res = await fetch(`/api/hello?name=${encodeURIComponent(name)}`);\n  if (!res.ok) throw new Error(res.statusText);\n  return res.json();\n};\n",
  "{\n  \"model\": \"gemma-4\",\n  \"messages\": [{\"role\": \"user\", \"content\": \"Hi!\\n\"}],\n  \"temperature\": 0.7,\n  \"stop\": [\"<turn|>\"]\n}\n",
  "<html>\n<body>\n<table>\n<tr><th>Name</th><td>Value</td></tr>\n</table>\n<div class=\"x\"><span>text</span> <a href=\"#\">link</a></div>\n<h1>Title</h1><code>x = 1</code>\n</body>\n</html>\n",
  "SELECT id, name FROM users WHERE age >= 18 AND name LIKE '%son' ORDER BY id DESC LIMIT 10;\n",
  "fn main() {\n    let s: String = \"héllo\".chars().rev().collect();\n    println!(\"{s:?}\");\n}\n",
  "# Title\n\n* item one\n* **bold** and _italic_\n\n```bash\n$ ls -la | grep '^d' > /dev/null 2>&1\n```\n\n> quote ~~strike~~ `code`\n",
];

const EMOJI = [
  "😀", "😂", "🥲", "👍", "👍🏽", "👋🏿", "❤️", "🔥", "🎉", "🚀", "🇫🇷", "🇯🇵", "🇺🇸", "1️⃣", "#️⃣",
  "👩‍👩‍👧‍👦", "👨‍💻", "🏳️‍🌈", "🧑🏻‍🤝‍🧑🏾", "👁️‍🗨️", "🐈‍⬛", "🫠", "🪿", "🧬", "☕", "✔️", "©️", "™",
];

const SPECIAL_STRINGS = [
  "<bos>", "<eos>", "<pad>", "<unk>", "<mask>", "[multimodal]", "<start_of_turn>", "<end_of_turn>",
  "<start_of_turn>user\n", "<end_of_turn>\n", "<start_of_image>", "<end_of_image>", "<image_soft_token>",
  "<|turn>", "<turn|>", "<|turn>model\n", "<|think|>", "<|channel>thought\n", "<channel|>", "<|tool>",
  "<tool|>", "<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>}<tool_call|>", "<|tool_response>",
  "<tool_response|>", "<|\"|>", "<|image|>", "<|audio|>", "<|video|>", "<|image>", "<image|>",
  "<unused0>", "<unused42>", "<unused6241>", "<unused6242>", "<bos", "bos>", "<|turn", "turn|>",
  "<<bos>>", "<bos><bos>", "<table>", "</td>", "<s>", "</s>", "▁▁", "▁▁▁▁", "▁", "\t\t", "\n\n\n",
];

const CONTROL = [
  "\u0000", "\u0001", "\u0007", "\b", "\u000b", "\f", "\r", "\r\n", "\u001b[31m", "\u007f", "\u0085",
  "\u00a0", "\u00ad", "\u200b", "\u200c", "\u200d", "\u200e", "\u200f", "\u2028", "\u2029", "\u2060",
  "\ufeff", "\ufffd", "\ufffc", "\u3000", "\u202e", "\u0301", "e\u0301", "\u034f",
];

// Code point ranges likely to be missing from the vocabulary (byte fallback) or rarely seen.
const RARE_RANGES = [
  [0x20000, 0x2a6df], // CJK Extension B
  [0x2a700, 0x2b73f], // CJK Extension C
  [0x30000, 0x3134f], // CJK Extension G
  [0xe000, 0xf8ff], // Private Use Area
  [0xf0000, 0xffffd], // Supplementary Private Use Area-A
  [0x100000, 0x10fffd], // Supplementary Private Use Area-B
  [0x1d400, 0x1d7ff], // Mathematical Alphanumeric Symbols
  [0x13000, 0x1342f], // Egyptian hieroglyphs
  [0x10900, 0x1091f], // Phoenician
  [0x1f000, 0x1faff], // Mahjong, cards, emoji blocks
  [0xa000, 0xa48f], // Yi
  [0x0250, 0x02af], // IPA extensions
  [0xfff0, 0xffff], // Specials, including the noncharacters U+FFFE and U+FFFF
];

function random_code_point() {
  for (;;) {
    const cp = chance(0.5) ? int(0x110000) : int(0x3000);
    if (cp >= 0xd800 && cp <= 0xdfff) continue; // no lone surrogates: not valid in UTF-8 text
    return String.fromCodePoint(cp);
  }
}

function rare_text(length) {
  let s = "";
  for (let i = 0; i < length; ++i) {
    const [lo, hi] = pick(RARE_RANGES);
    s += String.fromCodePoint(lo + int(hi - lo + 1));
  }
  return s;
}

function whitespace_run() {
  const kind = pick([" ", " ", " ", "\t", "\n", "\u3000", "\u2581", " \t", "\n ", "\r\n"]);
  return kind.repeat(1 + (chance(0.3) ? int(40) : int(4)));
}

function words(language) {
  return PROSE[language].split(/(?<=\s)/u);
}

// A run of prose from one language, with its words shuffled a little so documents differ.
function prose(language, approx_chars) {
  const pool = words(language);
  let s = "";
  let i = int(pool.length);
  while (s.length < approx_chars) {
    s += chance(0.8) ? pool[i % pool.length] : pick(pool);
    ++i;
    if (chance(0.03)) s += chance(0.5) ? "\n" : "\n\n";
  }
  return s;
}

function piece() {
  const r = random();
  if (r < 0.45) return prose(pick(Object.keys(PROSE)), 40 + int(400));
  if (r < 0.55) return pick(CODE);
  if (r < 0.62) return Array.from({ length: 1 + int(6) }, () => pick(EMOJI)).join(chance(0.5) ? "" : " ");
  if (r < 0.70) return pick(SPECIAL_STRINGS);
  if (r < 0.76) return pick(CONTROL);
  if (r < 0.82) return rare_text(1 + int(12));
  if (r < 0.88) return whitespace_run();
  if (r < 0.92) return Array.from({ length: 1 + int(20) }, random_code_point).join("");
  if (r < 0.96) return String(int(1e9)) + pick([".", ",", " ", "", "e", "%"]) + String(int(1000));
  return pick(["http://example.com/a?b=c&d=e#f", "user@example.org", "C:\\Windows\\system32", "../../etc/passwd", "v1.2.3-rc.4+build.5", "snake_case_name", "CamelCaseName", "ALLCAPS", "a.b.c", "--flag=value"]);
}

function document() {
  const shape = random();
  let doc = "";
  if (shape < 0.04) {
    // One very long line (no newline, so one long BPE segment) in a script without spaces.
    const lang = pick(["chinese", "japanese", "thai", "english", "korean"]);
    doc = prose(lang, 5000 + int(20000)).replace(/\n/g, "");
  } else if (shape < 0.08) {
    doc = pick(["a", "ab", " ", "é", "\u2581", "!", "0"]).repeat(1 + int(3000));
  } else {
    const n = 1 + int(12);
    for (let i = 0; i < n; ++i) {
      doc += piece();
      if (chance(0.3)) doc += pick([" ", "\n", "", "  ", "\t"]);
    }
  }
  if (chance(0.15)) doc = whitespace_run() + doc;
  if (chance(0.15)) doc += whitespace_run();
  return doc;
}

const docs = [];
let bytes = 0;
// A few fixed documents first: the edge cases every run must cover.
for (const fixed of ["", " ", "  ", "\u2581", "Hello world", " Hello", "Hello ", "<bos>", "<|turn>user\nHi<turn|>\n", "\u{20000}", "\u{10FFFD}"]) {
  docs.push(fixed);
}
while (bytes < kilobytes * 1024) {
  const doc = document();
  docs.push(doc);
  bytes += Buffer.byteLength(doc, "utf8");
}
writeFileSync(out, JSON.stringify(docs));
