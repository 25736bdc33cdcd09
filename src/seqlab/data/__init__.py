"""Data files shipped with seqlab, read with ``importlib.resources`` (no code).

* ``bible-web-rv1909.tsv.xz``: the Bible verse by verse in English (World English Bible) and Spanish
  (Reina-Valera 1909), both public domain; built by ``scripts/build_bible_pairs.py`` and read by
  ``seqlab.tasks.parallel.bible_pairs``.
"""
