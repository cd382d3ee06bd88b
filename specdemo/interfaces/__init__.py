"""Interfaces: the command line and the gradio app and its tabs. Imports from every layer below."""
