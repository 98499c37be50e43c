"""Data files shipped with the package (the embedded word-level corpus lives in kjv/)."""
