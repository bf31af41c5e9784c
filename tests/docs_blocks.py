"""The commands the docs mark to run, and the README's verdict block against a demo's output
(docs/contributing.md, "Commands in the docs run").

A fenced bash or python block runs when the line before it is `<!-- docs-test: run -->`, or
`<!-- docs-test: run; expect: TEXT -->` to require TEXT in what it prints. The README's verdict
block is the code block after `<!-- demo-verdict -->`: the first lines `make demo` prints from
its verdict rule on, latency figures (which move from machine to machine) masked."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

MARKED = re.compile(
    r"^<!-- docs-test: run(?:; expect: (?P<expect>.*?))? -->\n```(?P<lang>[\w-]*)[^\n]*\n(?P<code>.*?)^```[ \t]*$",
    re.M | re.S)
MARKER = re.compile(r"^<!-- docs-test:[^>]*-->", re.M)
# A four-backtick fence shows markdown as it is written (an example of a marked block): not run.
QUOTED = re.compile(r"^````.*?^````[ \t]*$", re.M | re.S)
LANGS = ("bash", "python")
VERDICT_MARK = "<!-- demo-verdict -->"
VERDICT_RULE = re.compile(r"^=+ verdict =+$")
# "+512.7 ms", "-6.0 ms", "+1.62 s": latencies differ with every machine and its load (and so does
# their unit); quality figures do not.
# the verdict joins a figure and its unit with a no-break space, so that a line never breaks between them
LATENCY = re.compile(r"[+-]?\d+(?:\.\d+)?[ \u00a0]m?s\b")
ELLIDED = {"…", "...", "[…]", "[...]"}


@dataclass(frozen=True)
class Block:
    page: str  # path relative to the repository
    line: int  # of the opening fence
    lang: str
    code: str
    expect: str | None

    def __str__(self) -> str:
        return f"{self.page}:{self.line}"


def marked_blocks(text: str, page: str) -> list[Block]:
    """The blocks of `text` marked to run, in order. A marker not followed by a bash or python
    block is an error: it would silently run nothing."""
    text = QUOTED.sub(lambda m: "\n" * m.group(0).count("\n"), text)  # line numbers kept
    blocks = []
    for m in MARKED.finditer(text):
        line = text.count("\n", 0, m.start("lang")) + 1
        if m.group("lang") not in LANGS:
            raise ValueError(f"{page}:{line}: a docs-test block must be bash or python, got {m.group('lang')!r}")
        blocks.append(Block(page, line, m.group("lang"), m.group("code"), m.group("expect")))
    if len(blocks) != len(MARKER.findall(text)):
        raise ValueError(f"{page}: a docs-test marker is not directly followed by a fenced block")
    return blocks


def run_block(block: Block, cwd: Path, timeout: float = 1200) -> subprocess.CompletedProcess[str]:
    """Runs a block as a reader would type it in the repository's root: bash with -euo pipefail,
    python with this interpreter (also the `python` the bash blocks find first)."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    argv = ["bash", "-euo", "pipefail", "-c", block.code] if block.lang == "bash" else [sys.executable, "-"]
    return subprocess.run(argv, cwd=cwd, env=env, input=block.code if block.lang == "python" else None,
                          capture_output=True, text=True, timeout=timeout)


def readme_verdict(readme: str) -> list[str]:
    """The lines of the code block after the verdict marker, without a closing ellipsis line."""
    at = readme.find(VERDICT_MARK)
    if at < 0:
        raise ValueError(f"README.md: no {VERDICT_MARK} before the verdict block")
    m = re.compile(r"```[^\n]*\n(.*?)^```", re.M | re.S).search(readme, at)
    if m is None:
        raise ValueError("README.md: no code block after the verdict marker")
    lines = m.group(1).rstrip("\n").split("\n")
    while lines and lines[-1].strip() in ELLIDED:
        lines.pop()
    return lines


def demo_verdict(log: str) -> list[str]:
    """A demo output's lines from its verdict rule on."""
    lines = log.splitlines()
    for i, line in enumerate(lines):
        if VERDICT_RULE.match(line.strip()):
            return lines[i:]
    raise ValueError("no verdict in the demo's output (did the demo finish?)")


# Whether a latency difference is significant depends on the machine's load while the demo runs
# (12 timed questions: one noisy one changes the test's outcome), so the latency statements are
# left out of the comparison; the quality statements and every figure besides them stay in it.
_LAT = r"retrieval latency ↓"
LATENCY_CLAUSES = [
    re.compile(rf",? but (?:loses|wins) on {_LAT} by <ms> \[<ms>, <ms>\]"),  # after a run's other results
    re.compile(rf"(?:; )?\S+ (?:loses to|beats) \S+ on {_LAT} by <ms> \[<ms>, <ms>\](?=[;.])"),  # a run's only result
    re.compile(rf"(?<=: ){_LAT} <ms>; |;? {_LAT} <ms>(?=[;.])"),  # in the detectable-differences list
    # a significant latency difference below the smallest that matters (on a loaded machine the
    # baseline is slower, and its 10% larger): named as neither a win nor a loss
    re.compile(rf" Significant, but smaller than the smallest difference that matters \(report\.min_effect\), so "
               rf"neither a win nor a loss: \S+ on {_LAT} by <ms> \[<ms>, <ms>\] \(it takes <ms>\)"
               rf"(?:(?:, | and )\S+ on {_LAT} by <ms> \[<ms>, <ms>\] \(it takes <ms>\))*\."),
]


def masked_words(lines: list[str]) -> list[str]:
    """Words with latencies masked (line breaks move when a latency has another width) and the
    statements about latency left out."""
    text = LATENCY.sub("<ms>", " ".join(lines))
    for clause in LATENCY_CLAUSES:
        text = clause.sub("", text)
    return re.sub(r":\s*;\s*", ": ", text).split()


def verdict_mismatch(readme_lines: list[str], log_lines: list[str]) -> str | None:
    """None when the README's block is the start of the demo's verdict, word for word (latencies
    masked); else where they part."""
    shown, printed = masked_words(readme_lines), masked_words(log_lines)
    for i, word in enumerate(shown):
        if i >= len(printed):
            return f"the README's block goes on after the demo's output ends: {' '.join(shown[i:i + 12])!r}"
        if word != printed[i]:
            return (f"word {i + 1}: the README has {' '.join(shown[max(0, i - 6):i + 6])!r} where the demo "
                    f"printed {' '.join(printed[max(0, i - 6):i + 6])!r}")
    return None
