"""Studies built on the step simulator: advise (configuration search), several jobs on one
fabric, whole runs with failures.
"""
