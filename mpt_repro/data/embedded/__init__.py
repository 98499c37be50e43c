"""Data files shipped with the package: the embedded word-level corpus (kjv/) and the parallel
corpus for translation (bible_enes/); README.md says where each comes from."""
