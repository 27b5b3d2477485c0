"""Documents: text that is more than one sentence a line, with markup and placeholders.

A line (or a server's text) in one of `FORMATS` is cut into *units* (a paragraph; each block
element of HTML or XML), a unit into sentences, and the sentences are what the model
translates; the translations are put back where their sources were, with the unit's inline
elements and placeholders projected onto the translated words through the word alignment.

- sentences.py: sentence splitting (sentencex), per source language.
- placeholders.py: `{name}`, `%1$s`, `$VAR`, `<x id="1"/>` and user patterns, kept verbatim.
- unit.py: a unit as text with marks (inline elements, kept pieces) and its sentences as
  words, the marks on word boundaries.
- project.py: a translated sentence with its marks put back (the placement rules).
- markup.py: HTML and XML parsed with lxml into units, and the translated tree written out.
- document.py: one input text: the sentences to translate, and the text made of their
  translations.

docs/documents.md says what is guaranteed and the rules. This package knows no model and no
torch: the server's own process reads documents with it.
"""

FORMATS = ("plain", "paragraphs", "html", "xml")
