"""Bibliography labels in author-year style ("He et al., 2016"), matching the in-text citations
(`bibtex_reference_style: author_year`). sphinxcontrib-bibtex takes its labels from a pybtex
label style; this registers one, and a formatting style that uses it (`bibtex_default_style`)."""
from collections import Counter
from string import ascii_lowercase

from pybtex.plugin import register_plugin
from pybtex.style.formatting.unsrt import Style as UnsrtStyle
from pybtex.style.labels import BaseLabelStyle


def author_year(entry) -> str:
    """'He et al., 2016' for three or more authors, 'Zhang and Li, 2023' for two; the title's
    first word where there are none."""
    people = entry.persons.get("author") or entry.persons.get("editor") or []
    last = [" ".join(p.last_names) for p in people]
    if len(last) > 2:
        names = f"{last[0]} et al."
    elif last:
        names = " and ".join(last)
    else:
        names = entry.fields.get("title", "Anonymous").split()[0]
    return f"{names}, {entry.fields.get('year', 'n.d.')}"


class AuthorYearLabels(BaseLabelStyle):
    def format_labels(self, sorted_entries):
        entries = list(sorted_entries)
        labels = [author_year(e) for e in entries]
        twice = {k for k, n in Counter(labels).items() if n > 1}
        seen = Counter()
        for label in labels:            # two works with one label: 2017a, 2017b
            if label in twice:
                seen[label] += 1
                label += ascii_lowercase[seen[label] - 1]
            yield label


class AuthorYearStyle(UnsrtStyle):
    default_label_style = "authoryear"
    default_sorting_style = "author_year_title"


def setup(app):
    register_plugin("pybtex.style.labels", "authoryear", AuthorYearLabels)
    register_plugin("pybtex.style.formatting", "authoryear", AuthorYearStyle)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
