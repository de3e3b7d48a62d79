"""Build the shipped Python-reference corpus from CPython's ``pydoc_data.topics``.

    python calibration/make_pydoc_corpus.py calibration/

``pydoc_data.topics`` holds the Language Reference and library topics that ``help()`` shows: English technical
prose with code. The topics, sorted by name, without repeated paragraphs and with their blank lines folded into
single newlines, are cut at line ends into sections of about 4,000 characters; each section is one paragraph, and
every 5th section (index ≡ 4 mod 5) goes to the test split, so both splits span every subject (topic sizes are too
uneven to split whole topics 4:1). The topics change between Python releases; README.md records the release that made
the shipped files.
"""
import re
import sys
from pathlib import Path

import pydoc_data.topics


def topics() -> list[tuple[str, str]]:
    """(name, text) of every topic, sorted by name, with every paragraph that an earlier topic already holds
    dropped (topics repeat whole passages of each other: without this a fifth of the text, and two fifths of the
    test split's lines, would also be in the train split), and the blank lines folded."""
    out, seen = [], set()
    for name in sorted(pydoc_data.topics.topics):
        kept = []
        for para in re.split(r"\n\s*\n", pydoc_data.topics.topics[name].strip()):
            key = para.strip()
            if key and key not in seen:
                seen.add(key)
                kept.append(para.rstrip())
        if kept:
            out.append((name, "\n".join(kept)))
    return out


def sections(size: int = 4000) -> list[str]:
    """The topics' lines packed into sections of at least ``size`` characters (a topic's end closes one)."""
    out = []
    for _, text in topics():
        current = []
        for line in text.split("\n"):
            current.append(line)
            if sum(len(x) + 1 for x in current) >= size:
                out.append("\n".join(current))
                current = []
        if current:
            out.append("\n".join(current))
    return out


def main(out_dir: str) -> None:
    train, test = [], []
    for i, text in enumerate(sections()):
        (test if i % 5 == 4 else train).append(text)
    out = Path(out_dir)
    (out / "pydoc-train.txt").write_text("\n\n".join(train) + "\n", encoding="utf-8")
    (out / "pydoc-test.txt").write_text("\n\n".join(test) + "\n", encoding="utf-8")
    print(f"Python {sys.version.split()[0]}: {len(train)} train / {len(test)} test sections")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else str(Path(__file__).parent))
