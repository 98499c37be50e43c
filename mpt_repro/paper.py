"""The paper's reference values (paper_reference.csv, package data): Micikevicius et al. 2018's
Tables 1-3 and its qualitative claims.

Every value in that file carries the section of the paper it comes from and how sure we are of
it: P = read in the paper's own text, S = from secondary notes that agree, U = unconfirmed.
Nothing else in the suite types a number. The reporter and the catalog (which experiments are the
paper's Table 1 rows) read it.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

import pandas as pd

CONFIDENCE_LABELS = {"P": "primary text", "S": "secondary notes", "U": "unconfirmed"}


@lru_cache(maxsize=1)
def load_reference() -> pd.DataFrame:
    """All reference rows; `value` is a float or NaN (an outcome like "diverges": `outcome`)."""
    with resources.files("mpt_repro").joinpath("paper_reference.csv").open() as f:
        ref = pd.read_csv(f, dtype=str, keep_default_na=False)
    # the value as the paper prints it ("69.1", "2.20"): shown as is, so no digit is invented
    ref["value_text"] = ref["value"]
    ref["value"] = pd.to_numeric(ref["value"].replace("", None), errors="raise").astype(float)
    return ref


def table1_reference() -> pd.DataFrame:
    """Paper Table 1 as one row per model: experiment, label, fp32, mixed, confidence, source."""
    ref = load_reference()
    t1 = ref[ref["table"] == "table1"]
    wide = t1.pivot(index="row", columns="column", values="value")
    text = t1.pivot(index="row", columns="column", values="value_text").add_suffix("_text")
    wide = wide.join(text)
    first = t1.drop_duplicates("row").set_index("row")
    wide["label"] = first["row_label"]
    wide["confidence"] = first["confidence"]
    wide["source"] = first["source"]
    # keep the paper's row order (the file lists the rows as the paper does)
    order = list(dict.fromkeys(t1["row"]))
    return wide.loc[order].rename_axis("experiment").reset_index()


def paper_table(name: str) -> pd.DataFrame:
    """The rows of one of the paper's tables (`table1`, `table2`, `table3`, `claim`), in order."""
    ref = load_reference()
    return ref[ref["table"] == name]


def claims_for(row: str) -> pd.DataFrame:
    """The qualitative claims the paper makes about one experiment (e.g. lstm_lm, dcgan)."""
    ref = load_reference()
    return ref[(ref["table"] == "claim") & (ref["row"] == row)]


def cite(entry: pd.Series) -> str:
    """`<source> [<confidence>]`, the tag a reader needs to judge a reference value."""
    return f"{entry['source']} [{entry['confidence']}]"
