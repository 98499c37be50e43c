"""Write a Table as Markdown, CSV and LaTeX (booktabs). All three show the same cell strings."""

from __future__ import annotations

from pathlib import Path

from mpt_repro.report.tables import Table

# LaTeX needs these escaped; the unicode signs of the cells become math-mode symbols
LATEX_ESCAPES = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "±": r"$\pm$",
    "Δ": r"$\Delta$",
    "−": r"$-$",
    "×": r"$\times$",
    "÷": r"$\div$",
    "§": r"\S{}",
    "≈": r"$\approx$",
}


def latex_escape(text: str) -> str:
    return "".join(LATEX_ESCAPES.get(ch, ch) for ch in str(text))


def markdown(table: Table) -> str:
    """A titled GitHub-flavoured Markdown table, caption above, notes below."""
    frame = table.frame

    def line(cells) -> str:
        return "| " + " | ".join(str(c).replace("|", r"\|") for c in cells) + " |"

    out = [f"### {table.title}", "", f"*{table.caption}*", ""]
    if frame.empty:
        out.append("(no rows)")
    else:
        out += [line(frame.columns), line(["---"] * len(frame.columns))]
        out += [line(row) for row in frame.itertuples(index=False)]
    if table.notes:
        out.append("")
        out += [f"- {note}" for note in table.notes]
    return "\n".join(out) + "\n"


def latex(table: Table) -> str:
    """A booktabs table: \\toprule, header, \\midrule, rows, \\bottomrule; caption included."""
    frame = table.frame
    spec = "l" * max(len(frame.columns), 1)
    out = [
        r"\begin{table}[ht]",
        r"\centering",
        r"\small",
        rf"\caption{{{latex_escape(table.title)}. {latex_escape(table.caption)}}}",
        rf"\begin{{tabular}}{{{spec}}}",
        r"\toprule",
        " & ".join(latex_escape(c) for c in frame.columns) + r" \\",
        r"\midrule",
    ]
    out += [
        " & ".join(latex_escape(c) for c in row) + r" \\" for row in frame.itertuples(index=False)
    ]
    out += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    return "\n".join(out) + "\n"


def write_table(table: Table, folder: Path) -> dict[str, Path]:
    """<slug>.csv, <slug>.tex and <slug>.md in `folder`; returns the paths by format."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = {ext: folder / f"{table.slug}.{ext}" for ext in ("csv", "tex", "md")}
    table.frame.to_csv(paths["csv"], index=False)
    paths["tex"].write_text(latex(table))
    paths["md"].write_text(markdown(table))
    return paths
