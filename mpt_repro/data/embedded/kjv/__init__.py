"""The embedded corpus files (train.txt, valid.txt, test.txt); a package so that wheels ship them."""
