"""Tests of the watch plugin: pipeline watch on files and schedules, in real subprocesses."""
