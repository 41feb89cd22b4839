"""The fault suite: every fault a user can cause (kill, Ctrl-C, full disk, corrupt or
hostile file, bad config, two processes at once), one test each, on real stores and runs.

Each case checks for a clear error naming the file or key, and that nothing is lost or
deleted that gnnssd did not make. One module per area (run directory, store, ...).
"""
