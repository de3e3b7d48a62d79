"""Rebuild the shipped KJV corpus from Debian's bible-kjv-text package.

Run on a Debian machine:  apt-get install bible-kjv bible-kjv-text
                          bible -l0 "gen1:1-rev22:21" > /tmp/kjv-raw.txt
                          python calibration/make_corpus.py /tmp/kjv-raw.txt calibration/
Each chapter becomes one paragraph (verse numbers dropped, verses joined with spaces);
every 10th chapter goes to the test split, the rest to train, so both splits span the whole book.
"""
import re
import sys
from pathlib import Path


def chapters(raw: str):
    title, verses = None, []
    for line in raw.splitlines():
        if not line.strip():
            continue
        m = re.match(r"^\s+\d+\s+(.*)$", line)
        if m:
            verses.append(m.group(1).strip())
        else:
            if title is not None and verses:
                yield title, " ".join(verses)
            title, verses = line.strip(), []
    if title is not None and verses:
        yield title, " ".join(verses)


def main(raw_path: str, out_dir: str) -> None:
    raw = Path(raw_path).read_text(encoding="utf-8", errors="replace")
    train, test = [], []
    for i, (title, body) in enumerate(chapters(raw)):
        (test if i % 10 == 9 else train).append(f"{title}\n{body}")
    out = Path(out_dir)
    (out / "kjv-train.txt").write_text("\n\n".join(train) + "\n", encoding="utf-8")
    (out / "kjv-test.txt").write_text("\n\n".join(test) + "\n", encoding="utf-8")
    print(f"train: {len(train)} chapters, test: {len(test)} chapters")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
