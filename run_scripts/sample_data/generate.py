"""Deterministic generator of the project's sample corpus (original text written for this project).

A small grammar over hand-written word lists produces sentence-like English prose about invented
towns, rivers, people and inventions, then writes it in every input format the pipeline reads:
books with a Project-Gutenberg-style header and licence (to be trimmed), a MediaWiki XML export
(.bz2), WikiExtractor <doc> output and JSON lines. Run from the repository root:

    .venv/bin/python run_scripts/sample_data/generate.py

Output is byte-identical on every run (fixed seed, no clock, no environment input).
"""

from __future__ import annotations

import bz2
import json
import random
from pathlib import Path
from xml.sax.saxutils import escape

OUT = Path(__file__).resolve().parent / "corpus"
SEED = 20261122

FIRST = [
    "Ada",
    "Bram",
    "Celia",
    "Dorian",
    "Edda",
    "Felix",
    "Greta",
    "Hugo",
    "Ines",
    "Jonas",
    "Kira",
    "Leon",
    "Mara",
    "Nils",
    "Olga",
    "Piet",
    "Quinn",
    "Rosa",
    "Silas",
    "Tilda",
    "Ulric",
    "Vera",
    "Wim",
    "Yara",
]
LAST = [
    "Ashdown",
    "Brightwater",
    "Caldwell",
    "Dunmore",
    "Elsworth",
    "Fairbank",
    "Greywell",
    "Holloway",
    "Ironside",
    "Kettering",
    "Larkspur",
    "Merriweather",
    "Northcote",
    "Oakhurst",
    "Pemberton",
    "Redfern",
]
TOWNS = [
    "Harrowgate",
    "Millbrook",
    "Stonehaven",
    "Westmere",
    "Fennick",
    "Oldcastle",
    "Brackwater",
    "Eldham",
    "Thornbury",
    "Kilnsey",
    "Ravensholm",
    "Sallowfield",
    "Marrowby",
    "Glenhollow",
]
RIVERS = ["Aldwyn", "Brisk", "Corran", "Dellow", "Esk", "Farrow", "Glent", "Hollin"]
TRADES = [
    "weaver",
    "miller",
    "clockmaker",
    "ferryman",
    "schoolteacher",
    "glassblower",
    "surveyor",
    "baker",
    "printer",
    "botanist",
    "lamplighter",
    "cartographer",
    "blacksmith",
    "librarian",
]
THINGS = [
    "lantern",
    "letter",
    "map",
    "violin",
    "compass",
    "garden",
    "bridge",
    "ledger",
    "telescope",
    "boat",
    "orchard",
    "clock",
    "kettle",
    "notebook",
    "wagon",
    "mill wheel",
    "printing press",
    "weather vane",
]
ADJ = [
    "old",
    "quiet",
    "narrow",
    "bright",
    "crooked",
    "patient",
    "weathered",
    "careful",
    "restless",
    "gentle",
    "stubborn",
    "curious",
    "broad",
    "hidden",
    "famous",
    "modest",
    "cold",
    "golden",
    "grey",
    "early",
]
PLACES = [
    "by the harbour",
    "behind the chapel",
    "at the edge of the marsh",
    "under the railway arch",
    "near the market square",
    "on the hill above the town",
    "beside the old mill",
    "along the towpath",
]
TIMES = [
    "In the spring",
    "Late that evening",
    "Before dawn",
    "Every Sunday",
    "During the long winter",
    "On the first day of autumn",
    "Some years later",
    "At noon",
    "After the flood",
    "That summer",
]
VERBS_T = [
    "repaired",
    "painted",
    "carried",
    "measured",
    "sold",
    "borrowed",
    "hid",
    "studied",
    "built",
    "described",
    "found",
    "cleaned",
    "opened",
    "mended",
    "drew",
    "guarded",
]
VERBS_I = [
    "laughed",
    "waited",
    "wandered",
    "listened",
    "hesitated",
    "slept",
    "worked",
    "sang",
    "argued",
    "returned",
    "smiled",
    "wrote",
]
FEEL = ["tired", "hopeful", "uneasy", "delighted", "puzzled", "proud", "lonely", "calm", "anxious", "content"]
WEATHER = [
    "rain drummed on the roof",
    "a thin fog lay over the fields",
    "the wind came off the sea",
    "snow had settled on the chimneys",
    "the sun was warm on the stones",
    "the river ran high and brown",
]
SUBJECTS = [
    "trade",
    "agriculture",
    "shipbuilding",
    "wool",
    "salt",
    "pottery",
    "printing",
    "clockmaking",
    "tanning",
    "fishing",
    "stone quarrying",
    "paper making",
]
FIELDS = ["astronomy", "botany", "geology", "mathematics", "hydraulics", "optics", "chemistry", "acoustics"]


class Prose:
    def __init__(self, seed: int) -> None:
        self.r = random.Random(seed)

    def c(self, xs):
        return self.r.choice(xs)

    def person(self) -> str:
        return f"{self.c(FIRST)} {self.c(LAST)}"

    def narrative_sentence(self, hero: str, friend: str) -> str:
        r = self.r
        forms = [
            lambda: f"{self.c(TIMES)}, {hero} {self.c(VERBS_T)} the {self.c(ADJ)} {self.c(THINGS)} {self.c(PLACES)}.",
            lambda: f"{hero} {self.c(VERBS_I)} for a while, because {self.c(WEATHER)}.",
            lambda: f"\u201cWhere did you find the {self.c(THINGS)}?\u201d asked {friend}.",
            lambda: (
                f"\u201cI found it {self.c(PLACES)},\u201d said {hero.split()[0]}, \u201cbut nobody believed me.\u201d"
            ),
            lambda: f"The {self.c(TRADES)} of {self.c(TOWNS)} had {self.c(VERBS_T)} it long ago, or so people said.",
            lambda: f"{friend.split()[0]} felt {self.c(FEEL)} and {self.c(FEEL)}, and said nothing for a long time.",
            lambda: f"Mr. {self.c(LAST)} and Mrs. {self.c(LAST)} arrived at {r.randint(2, 11)} o'clock, a little late.",
            lambda: (
                f"It was {r.randint(3, 40)} miles to {self.c(TOWNS)}, and the road was {self.c(ADJ)} and {self.c(ADJ)}."
            ),
            lambda: f"When the {self.c(THINGS)} was finally {self.c(VERBS_T)}, {hero.split()[0]} {self.c(VERBS_I)}.",
            lambda: (
                f"Nobody in the village, not even the {self.c(TRADES)}, knew why the {self.c(THINGS)} had been {self.c(VERBS_T)}."
            ),
            lambda: (
                f"{hero.split()[0]} wrote in the {self.c(THINGS) if False else 'notebook'}: \u201c{self.c(WEATHER).capitalize()}; the {self.c(THINGS)} is safe.\u201d"
            ),
            lambda: f"Was it the {self.c(ADJ)} {self.c(THINGS)}, or only the {self.c(ADJ)} one {self.c(PLACES)}?",
        ]
        return self.c(forms)()

    def paragraph(self, hero: str, friend: str, width: int = 72) -> str:
        text = " ".join(self.narrative_sentence(hero, friend) for _ in range(self.r.randint(3, 7)))
        # hard-wrap like a Gutenberg plain-text book
        lines, line = [], ""
        for w in text.split():
            if line and len(line) + 1 + len(w) > width:
                lines.append(line)
                line = w
            else:
                line = f"{line} {w}" if line else w
        lines.append(line)
        return "\n".join(lines)

    def book(self, title: str, author: str, chapters: int) -> str:
        hero, friend = self.person(), self.person()
        header = (
            f"The Project Gutenberg-style eBook of {title}, by {author}\n\n"
            f"This sample book was written by a program for the sparse-attention BERT project.\n"
            f"It is not a real Project Gutenberg eBook; the header and licence imitate their layout\n"
            f"so that the pipeline's trimming can be exercised.\n\n"
            f"Title: {title}\nAuthor: {author}\nLanguage: English\n\n"
            f"*** START OF THIS PROJECT GUTENBERG EBOOK {title.upper()} ***\n\n\n"
        )
        body = [f"{title.upper()}\n\nby {author}\n"]
        for ch in range(1, chapters + 1):
            body.append(f"CHAPTER {ch}.\n")
            for _ in range(self.r.randint(6, 10)):
                body.append(self.paragraph(hero, friend))
        footer = (
            f"\n\n*** END OF THIS PROJECT GUTENBERG EBOOK {title.upper()} ***\n\n"
            "Licence placeholder. This section imitates the licence text that follows real eBooks.\n"
            "It must never reach the shards: the pipeline cuts everything after the END marker.\n"
        )
        return header + "\n\n".join(body) + footer

    def article(self) -> tuple[str, list[tuple[str | None, list[str]]]]:
        """An encyclopedia-like article: title and sections of sentences."""
        r = self.r
        kind = r.choice(["town", "river", "person", "invention"])
        if kind == "town":
            name = f"{self.c(TOWNS)} {self.c(['Cross', 'Green', 'Bridge', 'Minor', 'Upon Esk', 'End'])}"
            lead = [
                f"{name} is a small market town on the River {self.c(RIVERS)}.",
                f"It had a population of {r.randint(900, 40000):,} at the census of {r.randint(1851, 2021)}.",
                f"The town grew around {self.c(SUBJECTS)} and later {self.c(SUBJECTS)}, e.g. in the {r.randint(14, 19)}th century.",
            ]
            secs = [
                (
                    "History",
                    [
                        f"The earliest record of {name} dates from {r.randint(900, 1500)} A.D., when it is listed as a {self.c(ADJ)} settlement.",
                        f"During the {r.randint(15, 19)}th century the town prospered from {self.c(SUBJECTS)}.",
                        f"A {self.c(ADJ)} bridge over the {self.c(RIVERS)} was built in {r.randint(1600, 1900)} by {self.person()}.",
                    ],
                ),
                (
                    "Geography",
                    [
                        f"{name} lies {r.randint(2, 60)} km north of {self.c(TOWNS)}.",
                        f"The surrounding land is mostly {self.c(['moorland', 'farmland', 'woodland', 'marsh'])}, drained by the {self.c(RIVERS)}.",
                        f"The climate is mild, with about {r.randint(600, 1400)} mm of rain per year.",
                    ],
                ),
            ]
        elif kind == "river":
            name = f"River {self.c(RIVERS)}"
            lead = [
                f"The {name} is a river of {r.randint(12, 240)} km that flows through {self.c(TOWNS)} and {self.c(TOWNS)}.",
                f"Its name is thought to come from an old word meaning \u201c{self.c(ADJ)} water\u201d.",
            ]
            secs = [
                (
                    "Course",
                    [
                        f"The river rises {self.c(PLACES)} at a height of {r.randint(100, 900)} m.",
                        f"It is joined by the {self.c(RIVERS)} near {self.c(TOWNS)}, and reaches the sea at {self.c(TOWNS)}.",
                    ],
                ),
                (
                    "Uses",
                    [
                        f"Water mills on the {name} once powered {self.c(SUBJECTS)} works.",
                        "Today the river is used for fishing, rowing and, in dry years, for irrigation.",
                    ],
                ),
            ]
        elif kind == "person":
            name = self.person()
            born = r.randint(1700, 1950)
            lead = [
                f"{name} ({born}\u2013{born + r.randint(35, 90)}) was a {self.c(TRADES)} and writer on {self.c(FIELDS)}.",
                f"{name.split()[0]} is best known for work on the {self.c(ADJ)} {self.c(THINGS)}.",
            ]
            secs = [
                (
                    "Early life",
                    [
                        f"{name.split()[0]} was born in {self.c(TOWNS)}, the child of a {self.c(TRADES)}.",
                        f"At the age of {r.randint(9, 18)} {name.split()[0]} was sent to study {self.c(FIELDS)} under Dr. {self.c(LAST)}.",
                    ],
                ),
                (
                    "Work",
                    [
                        f"In {born + r.randint(20, 40)} {name.split()[0]} published a study of {self.c(FIELDS)}, which sold {r.randint(200, 9000):,} copies.",
                        f"Critics, i.e. the reviewers of the day, called it {self.c(ADJ)} but {self.c(ADJ)}.",
                        f"The book was reprinted in {self.c(TOWNS)} and translated into {r.randint(2, 9)} languages.",
                    ],
                ),
            ]
        else:
            name = f"{self.c(LAST)} {self.c(THINGS)}"
            lead = [
                f"The {name} is a device invented in {r.randint(1750, 1920)} for use in {self.c(SUBJECTS)}.",
                f"It works by turning a {self.c(ADJ)} wheel that drives a {self.c(THINGS)}.",
            ]
            secs = [
                (
                    "Design",
                    [
                        f"A typical {name} weighs about {r.randint(2, 300)} kg and is made of oak and brass.",
                        f"Later versions, built in {self.c(TOWNS)}, added a {self.c(ADJ)} {self.c(THINGS)}.",
                    ],
                ),
                (
                    "Legacy",
                    [
                        f"Several examples survive in museums, e.g. in {self.c(TOWNS)} and {self.c(TOWNS)}.",
                        f"The design influenced later work in {self.c(FIELDS)}.",
                    ],
                ),
            ]
        return name, [(None, lead)] + secs


def wikitext(sections, rng: random.Random, title: str) -> str:
    """Render sections as wikitext with links, templates, refs, a table and a category."""
    out = ["{{Infobox place\n| name = " + title + "\n| founded = " + str(rng.randint(900, 1800)) + "\n}}"]
    for head, sents in sections:
        if head:
            out.append(f"== {head} ==")
        words = []
        for s in sents:
            if rng.random() < 0.4:
                s = s.replace(" the ", " the [[Main Article|", 1).replace(" ", "]] ", 1) if False else s
            if rng.random() < 0.3:
                s = (
                    s.rstrip(".")
                    + f"<ref>{{{{cite book|title=Notes on {title}|year={rng.randint(1900, 2020)}}}}}</ref>."
                )
            words.append(s)
        para = " ".join(words)
        # link the first capitalised town/river name that appears
        for name in TOWNS + RIVERS:
            if name in para:
                para = para.replace(name, f"[[{name}]]", 1)
                break
        out.append(para)
    out.append('{| class="wikitable"\n|-\n! Year !! Value\n|-\n| 1900 || 12\n|}')
    out.append(f"[[Category:Invented places]]\n[[File:{title.replace(' ', '_')}.jpg|thumb|A view]]")
    return "\n\n".join(out)


def main() -> None:
    p = Prose(SEED)
    books = OUT / "books"
    wiki = OUT / "wiki"
    for d in (books, wiki, OUT / "wikiextractor" / "AA", OUT / "jsonl"):
        d.mkdir(parents=True, exist_ok=True)
    titles = [
        ("The Lantern of Harrowgate", "Imogen Pell"),
        ("A Winter on the Aldwyn", "Tobias Crane"),
        ("The Clockmaker's Ledger", "Ruth Ambler"),
        ("Letters from Stonehaven", "Owen Marsh"),
    ]
    for i, (t, a) in enumerate(titles):
        (books / f"book{i + 1:02d}_{t.lower().replace(' ', '_').replace(chr(39), '')}.txt").write_text(
            p.book(t, a, chapters=14), encoding="utf-8"
        )

    articles = [p.article() for _ in range(420)]
    # MediaWiki export: articles, plus a redirect and a talk page that the reader must skip
    pages = []
    for i, (title, secs) in enumerate(articles[:150]):
        pages.append((title, 0, wikitext(secs, p.r, title), False))
    pages.insert(3, ("Harrowgate Town", 0, "#REDIRECT [[Harrowgate Cross]]", True))
    pages.insert(7, ("Talk:Millbrook End", 1, "This is a discussion page, not an article.", False))
    xml = [
        '<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/" version="0.10" xml:lang="en">',
        "  <siteinfo>\n    <sitename>Sample wiki</sitename>\n  </siteinfo>",
    ]
    for pid, (title, ns, text, redirect) in enumerate(pages, start=1):
        red = f'\n    <redirect title="{escape(text.split("[[")[1].rstrip("]"))}" />' if redirect else ""
        xml.append(
            f"  <page>\n    <title>{escape(title)}</title>\n    <ns>{ns}</ns>\n    <id>{pid}</id>{red}\n"
            f"    <revision>\n      <id>{1000 + pid}</id>\n      <model>wikitext</model>\n"
            f'      <text xml:space="preserve">{escape(text)}</text>\n    </revision>\n  </page>'
        )
    xml.append("</mediawiki>\n")
    data = "\n".join(xml).encode("utf-8")
    (wiki / "sample-pages-articles.xml.bz2").write_bytes(bz2.compress(data, 9))

    # WikiExtractor output: title line, then the body lines
    docs = []
    for i, (title, secs) in enumerate(articles[150:300]):
        body = [title, ""]
        for head, sents in secs:
            if head:
                body.append(head + ".")
            body.append(" ".join(sents))
        docs.append(
            f'<doc id="{i + 1}" url="https://example.org/wiki?curid={i + 1}" title="{escape(title)}">\n'
            + "\n".join(body)
            + "\n</doc>\n"
        )
    (OUT / "wikiextractor" / "AA" / "wiki_00").write_text("".join(docs[:75]), encoding="utf-8")
    (OUT / "wikiextractor" / "AA" / "wiki_01").write_text("".join(docs[75:]), encoding="utf-8")

    # JSON lines: one article per line, paragraphs separated by newlines
    with open(OUT / "jsonl" / "articles.jsonl", "w", encoding="utf-8") as f:
        for title, secs in articles[300:]:
            text = "\n".join(" ".join(s) for _, s in secs)
            f.write(json.dumps({"title": title, "text": text}, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
