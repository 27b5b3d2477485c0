"""HTML and XML parsed with lxml into units (unit.py), and written back with the units'
translations: lxml because one library parses both, repairs broken input as libxml2 does,
and is the fastest of those measured (BENCHMARKS.md, "Documents and markup").

A text is a fragment (wrapped in a root of our own while it is read) or, when it begins with a
doctype, `<html` or `<?xml`, a whole document. Block elements (everything not inline) hold
units: the text between their block children. Inline elements (`decode.inline_tags`, and in
any format an element standing in running text, like XLIFF's `<g>` or a custom element) are
spans; a void element (`<br>`, `<img>`, `<x/>`), an inline element with no words, a comment and
an element not to translate are kept marks. Not translated, written back byte for byte by the
parser: `decode.keep_tags` (`script`, `style`, `pre`, `code`, ...), any element with
`translate="no"` or the class `notranslate`, and attributes.

The output is lxml's serialisation of the translated tree, so it always parses; every element
of the source is in it once, with its attributes (tested). Entities are read as the characters
they stand for and written as the serialiser writes characters (`&amp;`, `&lt;` and `&gt;`
escaped; HTML's no-break space as `&nbsp;`).
"""

from __future__ import annotations

import copy
import html
import re
from collections import Counter
from dataclasses import dataclass, field

import lxml.etree as etree
import lxml.html

from mtx.documents.atoms import Atom, Kind
from mtx.documents.unit import Unit

ROOT = "mtx-root"
KEEP_SOURCE = "mtx-source"  # an XLIFF source whose target is translated (while reading only)
BREAKS = {"br"}  # a line break: it ends a sentence
VOID = {"br", "img", "wbr", "hr", "input", "x", "ph", "bx", "ex", "it"}
BLOCK = {
    "address", "article", "aside", "blockquote", "body", "dd", "div", "dl", "dt", "figcaption",
    "figure", "footer", "form", "h1", "h2", "h3", "h4", "h5", "h6", "head", "header", "hr",
    "html", "li", "main", "nav", "ol", "p", "section", "table", "tbody", "td", "tfoot", "th",
    "thead", "title", "tr", "ul", "option", "caption", "button", "legend", "summary", ROOT,
}  # fmt: skip
# libxml2's complaints that are no repair: HTML5 and custom elements it does not know
NOT_REPAIRS = ("HTML_UNKNOWN_TAG",)


@dataclass
class Slot:
    """Where a unit lives in the tree: in `parent`, after the block child `after` (its tail)
    or at the start (its text), with the inline `nodes` that follow, up to the next block."""

    parent: etree._Element
    after: etree._Element | None
    nodes: list = field(default_factory=list)


@dataclass
class Tree:
    """A parsed text: its units and their slots, and what the parser repaired."""

    root: etree._Element
    kind: str  # "html" or "xml"
    whole: bool  # a document (else a fragment under our root)
    head: str  # what came before the document's root (an XML declaration) and after it
    tail: str
    units: list[tuple[Unit, Slot]]
    repairs: list[str]

    def write(self, slot: Slot, unit: Unit, atoms: list[Atom]) -> None:
        """Put a unit's translation (project.py's atoms, marks as keys) in its slot."""
        holder = etree.Element("holder")
        stack = [holder]
        for atom in atoms:
            if atom.kind.text:
                _add_text(stack[-1], atom.value)
            elif atom.kind is Kind.OPEN:
                new = _bare(unit.marks[atom.value].payload)
                stack[-1].append(new)
                stack.append(new)
            elif atom.kind is Kind.CLOSE:
                stack.pop()
            else:
                payload = unit.marks[atom.value].payload
                if isinstance(payload, str):
                    _add_text(stack[-1], payload)
                else:
                    kept = copy.deepcopy(payload)
                    kept.tail = None
                    stack[-1].append(kept)
        parent = slot.parent
        for node in slot.nodes:
            parent.remove(node)
        index = 0 if slot.after is None else parent.index(slot.after) + 1
        if slot.after is None:
            parent.text = holder.text
        else:
            slot.after.tail = holder.text
        for offset, node in enumerate(list(holder)):
            parent.insert(index + offset, node)

    def serialise(self) -> str:
        method = "html" if self.kind == "html" else "xml"
        if self.whole:  # the root and what stands beside it, without the parser's doctype
            before = list(self.root.itersiblings(preceding=True))[::-1]
            nodes = [*before, self.root, *self.root.itersiblings()]
            text = "".join(
                etree.tostring(n, encoding="unicode", method=method, with_tail=False) for n in nodes
            )
        else:
            text = etree.tostring(self.root, encoding="unicode", method=method)
            text = text[len(ROOT) + 2 : -(len(ROOT) + 3)] if text.endswith(f"</{ROOT}>") else ""
        if self.kind == "html":
            text = text.replace("\xa0", "&nbsp;")
        return self.head + text + self.tail


def _bare(element):
    """A copy of `element`: its tag and attributes, no content (even a tag name the parser
    made up from broken input, which no element could be made with)."""
    out = copy.copy(element)  # lxml copies the subtree
    for child in list(out):
        out.remove(child)
    out.text = out.tail = None
    return out


def _add_text(element, text: str) -> None:
    if len(element):
        element[-1].tail = (element[-1].tail or "") + text
    else:
        element.text = (element.text or "") + text


class Unreadable(Exception):
    """A text the parser cannot read even with its repairs (document.py translates it as
    text)."""


# what XML 1.0 cannot hold (lxml refuses to store it): control characters, surrogates
NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff\ud800-\udfff]")


def parse(text: str, kind: str, settings) -> Tree:
    """`text` as HTML or XML (`kind`), its units read with `settings` (document.py's);
    Unreadable if the parser cannot read it or write it back."""
    removed = len(NOT_XML.findall(text))
    text = NOT_XML.sub(" ", text)
    try:
        tree = _parse(text, kind)
        _check_names(tree.root)
        tree.serialise()  # what cannot be written back is found now, before translating
    except (etree.LxmlError, ValueError, UnicodeError) as e:
        raise Unreadable(f"not {kind.upper()} the parser can read ({e})") from None
    _xliff_targets(tree)
    if removed:
        tree.repairs.insert(0, f"{removed} character(s) {kind.upper()} cannot hold read as spaces")
    lost = _lost(text, tree.root)
    if lost:
        shown = " ".join(lost[:20]) + (" ..." if len(lost) > 20 else "")
        tree.repairs.append(f"{len(lost)} word(s) the parser's repair dropped: {shown}")
    _Reader(tree, settings).block(tree.root)
    for element in tree.root.iter():
        if isinstance(element.tag, str):
            element.attrib.pop(KEEP_SOURCE, None)
    return tree


def _parse(text: str, kind: str) -> Tree:
    stripped = text.lstrip()
    lead, trail = text[: len(text) - len(stripped)], text[len(text.rstrip()) :]
    head = stripped[:9].lower()
    whole = head.startswith(("<!doctype", "<html")) or (kind == "xml" and head.startswith("<?xml"))
    if kind == "html":
        parser = lxml.html.HTMLParser(recover=True, remove_comments=False)
        if whole:
            root = lxml.html.document_fromstring(stripped, parser=parser)
            lead += _doctype(stripped)
        else:
            root = lxml.html.fragment_fromstring(text, create_parent=ROOT, parser=parser)
            lead = trail = ""
    else:
        # entities defined in the text are read, never a file or URL they name
        parser = etree.XMLParser(
            recover=True, resolve_entities="internal", no_network=True, remove_comments=False
        )
        source = stripped if whole else f"<{ROOT}>{text}</{ROOT}>"
        declaration = ""
        if whole and stripped.startswith("<?xml"):
            end = stripped.index("?>") + 2
            rest = stripped[end:]
            declaration = stripped[:end] + rest[: len(rest) - len(rest.lstrip())]
            source = rest.lstrip()
        if whole:
            declaration += _doctype(source)
        root = etree.fromstring(source, parser)
        if root is None:
            root = etree.Element(ROOT)
        lead = lead + declaration if whole else ""
        trail = trail if whole else ""
    several = "\n" in text.strip()  # a document: say the parser's line
    repairs = [
        f"{kind.upper()} repaired by the parser"
        + (f" (the text's line {e.line})" if several else "")
        + f": {_said(e.message)}"
        for e in parser.error_log
        if e.type_name not in NOT_REPAIRS
    ]
    return Tree(root, kind, whole, lead, trail, [], repairs)


NAME = re.compile(r"[^\W\d][\w.\-]*(?::[^\W\d][\w.\-]*)?")  # an element's name, as written


def _check_names(root) -> None:
    """ValueError where the parser's repair made an element of a name that cannot be written
    back (`<:` becomes an element named ":")."""
    for element in root.iter():
        if isinstance(element.tag, str) and not NAME.fullmatch(element.tag.rpartition("}")[2]):
            raise ValueError(f"no element can be named {element.tag!r}")


def _local(element) -> str:
    tag = element.tag  # "{namespace}name" or "name" (even one broken input made up)
    return tag.rpartition("}")[2].lower() if isinstance(tag, str) else ""


def _xliff_targets(tree: Tree) -> None:
    """An XLIFF file (1.2's trans-unit, 2.0's segment) keeps each `<source>` as it is and gets
    its translation in a `<target>` after it (a copy of the source, translated; one that was
    there is replaced), as translation tools read it."""
    if tree.kind != "xml":
        return
    files = [tree.root] if _local(tree.root) == "xliff" else []
    files += [e for e in tree.root if _local(e) == "xliff"]  # in a fragment
    for source in [e for f in files for e in f.iter() if _local(e) == "source"]:
        parent = source.getparent()
        if parent is None:
            continue
        for old in [e for e in parent if _local(e) == "target"]:
            parent.remove(old)
        target = copy.deepcopy(source)
        target.tag = source.tag[: len(source.tag) - len("source")] + "target"
        target.attrib.pop("{http://www.w3.org/XML/1998/namespace}lang", None)
        target.tail = source.tail
        source.addnext(target)
        source.set(KEEP_SOURCE, "")  # read as kept: the reader translates the target


def _said(message: str) -> str:
    """libxml2's message about the user's text, without the root this module wraps a
    fragment in (a user never wrote `mtx-root`)."""
    unclosed = re.fullmatch(rf"Opening and ending tag mismatch: (\S+) line \d+ and {ROOT}", message)
    if unclosed:
        return f"<{unclosed.group(1)}> is not closed"
    stray = re.fullmatch(rf"Opening and ending tag mismatch: {ROOT} line \d+ and (\S+)", message)
    if stray:
        return f"</{stray.group(1)}> closes no open element: what follows it is dropped"
    return message.replace(ROOT, "the text")


# what is not text a user wrote: comments, CDATA marks, tags, a tag left open (`</b sleeps`
# loses its `</b`), entities
MARKUP = re.compile(
    r"<!--.*?(?:-->|$)|<!\[CDATA\[|\]\]>|<[^<>]*>|</?[A-Za-z][^\s<>/]*|&#?\w+;", re.S
)
WORD = re.compile(r"\w+")


def _lost(text: str, root) -> list[str]:
    """The words of `text` (read without its markup) that the parsed tree does not hold, in
    order: what a repair of broken markup dropped (`the <b>dog</b sleeps.` loses "sleeps")."""
    held = Counter(WORD.findall(" ".join(root.itertext())))
    out = []
    for word in WORD.findall(MARKUP.sub(" ", html.unescape(text))):
        if held[word] > 0:
            held[word] -= 1
        else:
            out.append(word)
    return out


# a document type declaration, its internal subset included, and the space after it
DOCTYPE = re.compile(r"<!doctype(?:[^\[>]|\[.*?\])*>\s*", re.I | re.S)


def _doctype(text: str) -> str:
    """The document type declaration `text` begins with, as written (the serialiser would
    write its own, or invent one where there is none), or ""."""
    match = DOCTYPE.match(text)
    return match.group(0) if match else ""


class _Reader:
    def __init__(self, tree: Tree, settings) -> None:
        self.tree, self.settings = tree, settings

    def block(self, element) -> None:
        """The units of a block element: its text and inline children up to each block child
        (read in turn), and after it."""
        slot, unit = Slot(element, None), Unit(self.settings.pattern)
        self.tree.units.append((unit, slot))
        unit.add_text(element.text or "")
        for child in element:
            if self.inline(child):
                slot.nodes.append(child)
                self.add(unit, child)
                continue
            if not self.kept(child):
                self.block(child)
            slot, unit = Slot(element, child), Unit(self.settings.pattern)
            self.tree.units.append((unit, slot))
            unit.add_text(child.tail or "")

    def add(self, unit: Unit, element) -> None:
        """An inline element (and its tail) into `unit`."""
        if self.name(element) in BREAKS and isinstance(element.tag, str):
            unit.line_break(element)
        elif self.whole_mark(element):
            unit.keep(element)
        else:
            unit.open(element)
            unit.add_text(element.text or "")
            for child in element:
                self.add(unit, child)
            unit.close()
        unit.add_text(element.tail or "")

    def name(self, element) -> str:
        tag = element.tag  # "{namespace}name" or "name" (even one broken input made up)
        return tag.rpartition("}")[2].lower() if isinstance(tag, str) else ""

    def kept(self, element) -> bool:
        """Not translated: a comment, a processing instruction, a kept tag, translate="no",
        class notranslate, an XLIFF source (its target is translated)."""
        if not isinstance(element.tag, str) or KEEP_SOURCE in element.attrib:
            return True
        if self.name(element) in self.settings.keep_tags:
            return True
        for key, value in element.attrib.items():
            local = key.rpartition("}")[2]
            if local == "translate" and value.strip().lower() == "no":
                return True
            if local == "class" and "notranslate" in value.split():
                return True
        return False

    def inline(self, element) -> bool:
        """An element of running text: an inline tag, or any element with text around it;
        never one holding a block."""
        if not isinstance(element.tag, str):
            return True  # a comment stays where it is
        name = self.name(element)
        if name in BLOCK and name not in self.settings.inline_tags:
            return False
        running = name in self.settings.inline_tags or _in_running_text(element)
        return running and not any(
            isinstance(d.tag, str) and self.name(d) in BLOCK for d in element.iterdescendants()
        )

    def whole_mark(self, element) -> bool:
        """An inline element kept whole: a void one, a kept one, one without words."""
        if self.kept(element) or self.name(element) in VOID:
            return True
        return not "".join(element.itertext()).split()


def _in_running_text(element) -> bool:
    parent = element.getparent()
    if parent is None:
        return False
    texts = [parent.text or ""] + [c.tail or "" for c in parent]
    return any(t.strip() for t in texts)
