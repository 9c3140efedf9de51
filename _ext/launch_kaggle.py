"""An "Open in Kaggle" launch button beside Colab's, on every notebook page.

sphinx-book-theme builds the Colab link from `_config.yml`'s repository (the one place it is
written); this derives Kaggle's from that link, so both follow the same setting. Kaggle opens
a public GitHub notebook at kaggle.com/kernels/welcome?src=<the notebook's GitHub URL>.
"""
COLAB_GITHUB = "https://colab.research.google.com/github/"
KAGGLE = "https://kaggle.com/kernels/welcome?src=https://github.com/"


def kaggle_url(colab_url: str) -> str:
    """Kaggle's launch URL for the notebook a Colab GitHub URL opens."""
    if not colab_url.startswith(COLAB_GITHUB):
        raise ValueError(f"not a Colab GitHub link: {colab_url}")
    return KAGGLE + colab_url[len(COLAB_GITHUB):]


def add_kaggle(app, pagename, templatename, context, doctree) -> None:
    """After the theme's launch buttons (priority 501): a Kaggle item after Colab's."""
    for group in context.get("header_buttons", []):
        if group.get("label") != "launch-buttons":
            continue
        buttons = group["buttons"]
        colab = next((b for b in buttons if b.get("text") == "Colab"), None)
        if colab is not None and not any(b.get("text") == "Kaggle" for b in buttons):
            buttons.insert(buttons.index(colab) + 1, {
                "type": "link", "text": "Kaggle", "tooltip": "Launch on Kaggle",
                "icon": "fab fa-kaggle", "url": kaggle_url(colab["url"])})


def setup(app):
    app.connect("html-page-context", add_kaggle, priority=502)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
