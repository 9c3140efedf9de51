"""The book's numbering: tables in cell outputs numbered like figures, and the exercises' own.

Tables. `mgpu_lib.book.tables.Table` renders as a Markdown table followed by its caption in
italics, which reads well in Jupyter and Colab. In the book, this turns that caption paragraph
into the table's title and gives the table an id, so Sphinx's numfig numbers it: "Table 3.1".
Sphinx numbers only captioned tables, so a Table without a caption stays unnumbered. Tables in
the prose are left to the `{table}` directive.

Exercises. They are the chapter's exercises, not chapters 7 and 8: their part of the toc is
unnumbered, and Sphinx would then count their figures and tables on from one shared counter
("Fig. 11" on the second exercise). `number_prefixes` (in _config.yml) names a prefix for such
pages, {"exercises/ex1_hyperparameters": "E1"}, and each gets its own count: "Fig. E1.3",
"Table E2.1".
"""
from docutils import nodes
from sphinx.transforms import SphinxTransform


def _in_output(node: nodes.Node) -> bool:
    """Whether node sits in a code cell's output (myst-nb's output containers)."""
    parent = node.parent
    while parent is not None:
        classes = parent.get("classes", []) if isinstance(parent, nodes.Element) else []
        if "cell_output" in classes or "output" in classes or \
                type(parent).__name__ == "MimeBundleNode":
            return True
        parent = parent.parent
    return False


def _caption_after(table: nodes.table):
    """The paragraph right after table if it is one emphasised run of text, else None."""
    parent = table.parent
    index = parent.index(table)
    if index + 1 >= len(parent):
        return None
    nxt = parent[index + 1]
    if isinstance(nxt, nodes.paragraph) and len(nxt) == 1 and isinstance(nxt[0], nodes.emphasis):
        return nxt
    return None


class NumberOutputTables(SphinxTransform):
    """Give each output table a title (its caption) and an id, before numbers are assigned."""

    default_priority = 500

    def apply(self, **kwargs) -> None:
        for table in list(self.document.findall(nodes.table)):
            if any(isinstance(c, nodes.title) for c in table.children) or not _in_output(table):
                continue
            caption = _caption_after(table)
            title = nodes.title("", "")
            if caption is not None:
                title += caption[0].children
                caption.parent.remove(caption)
            table.insert(0, title)
            if not table["ids"]:
                self.document.set_id(table, suggested_prefix="table")


def prefix_numbers(app, env) -> list:
    """Renumber the figures and tables of each prefixed page: (prefix, 1), (prefix, 2), ...
    Runs after Sphinx assigned its numbers; returns the pages to write again."""
    changed = []
    for docname, prefix in app.config.number_prefixes.items():
        for figtype, numbers in env.toc_fignumbers.get(docname, {}).items():
            order = sorted(numbers, key=lambda k: numbers[k])
            numbers.update({k: (prefix, i) for i, k in enumerate(order, 1)})
            changed.append(docname)
    return sorted(set(changed))


def setup(app):
    app.add_transform(NumberOutputTables)
    app.add_config_value("number_prefixes", {}, "env", [dict])
    app.connect("env-get-updated", prefix_numbers, priority=900)  # after the toctree collector
    return {"parallel_read_safe": True, "parallel_write_safe": True}
