"""The two evaluators of a Plan: the closed form and the engine replay, and per-rank
timelines.
"""
