"""The embedded default store: one SQLite file in WAL mode (``store``), its file permissions
(``files``) and its search-attribute index (``search``).
"""
