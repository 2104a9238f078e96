"""The flows that chain the stages: run.py builds one target (plan → … → publish); promote.py tests a staged wheel
on a GPU machine and promotes it."""
