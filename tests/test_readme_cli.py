"""README.md's "The CLI at a glance" names every option of every command, so a new option cannot go unlisted."""

from __future__ import annotations

import re
from pathlib import Path

import click

from edge_sdk.cli import main

README = Path(__file__).resolve().parents[1] / "README.md"
EXPORT_TAKES_CALIBRATE_OPTIONS = "[every predictor option of calibrate]"


def commands(group: click.Group, prefix: str = "") -> dict[str, click.Command]:
    found = {}
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            found |= commands(command, f"{prefix}{name} ")
        else:
            found[prefix + name] = command
    return found


def glance_entries() -> dict[str, str]:
    """Each command's entry in the glance block: its first line and the indented lines after it."""
    text = README.read_text()
    block = text.split("## The CLI at a glance", 1)[1].split("```", 2)[1]
    entries: dict[str, str] = {}
    for chunk in re.split(r"\n(?=edge-sdk )", block.strip()):
        for part in chunk.split(" / edge-sdk "):  # pack / unpack share a line
            words = part.removeprefix("edge-sdk ").split()
            name = " ".join(words[:2]) if words[0] == "bench" else words[0]
            entries[name] = part
    return entries


def option_names(command: click.Command) -> list[list[str]]:
    return [option.opts for option in command.params if isinstance(option, click.Option)]


def test_every_command_and_option_is_in_the_glance():
    entries, cli = glance_entries(), commands(main)
    assert sorted(entries) == sorted(cli)
    missing = []
    for name, command in cli.items():
        listed = entries[name]
        if EXPORT_TAKES_CALIBRATE_OPTIONS in listed:
            listed += entries["calibrate"]
        for spellings in option_names(command):
            if not any(re.search(rf"(?<![\w-]){re.escape(spelling)}(?![\w-])", listed) for spelling in spellings):
                missing.append(f"{name} {spellings[-1]}")
    assert missing == []
