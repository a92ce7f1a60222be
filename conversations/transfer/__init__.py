"""Import and export: one module per file format (`arbor_tree`, `chatgpt`, `markdown`), sharing the typed
items of `conversations.items` and one validated plan (`plan`) for everything an import writes."""
