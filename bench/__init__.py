"""One benchmark per file (`cobatch bench NAME`), each beside a baseline measured in the same run, and the run record."""
