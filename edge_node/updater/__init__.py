"""The updater (DESIGN §5): director checks, the model store and the update journal.

`director` verifies signed assignments (pure); `journal` holds the active / previous /
trial state and its transitions; `store` keeps model files by content hash. Downloading,
TUF refresh, self-test and the hot swap are not here.
"""
