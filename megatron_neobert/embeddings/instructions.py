"""The paper's task instructions (assets/instructions.json) and the one template that joins them to queries."""

import json
from functools import lru_cache
from pathlib import Path
from typing import Optional

INSTRUCTIONS_FILE = Path(__file__).resolve().parent.parent / "assets" / "instructions.json"


@lru_cache(maxsize=None)
def load_instructions(path: Optional[str] = None) -> dict:
    with open(path or INSTRUCTIONS_FILE, encoding="utf-8") as f:
        data = json.load(f)
    for key in ("template", "finetune", "mteb"):
        if key not in data:
            raise ValueError(f"{path or INSTRUCTIONS_FILE} lacks the {key!r} section")
    return data


def format_query(instruction: Optional[str], text: str, template: Optional[str] = None) -> str:
    """`text` with `instruction` prepended; no instruction leaves the text unchanged (documents, plain queries)."""
    if not instruction:
        return text
    return (template or load_instructions()["template"]).format(instruction=instruction, text=text)


def finetune_instruction(dataset_name: str) -> Optional[str]:
    """Instruction for a fine-tuning dataset by (case-insensitive) name, e.g. 'msmarco'; None when unknown."""
    table = {k.lower(): v for k, v in load_instructions()["finetune"].items()}
    return table.get(dataset_name.lower())


def mteb_instruction(task_name: str, task_type: Optional[str] = None) -> Optional[str]:
    """Per-task evaluation instruction: the exact task, then a family prefix (CQADupstack*), then the task type."""
    data = load_instructions()
    table = {k.lower(): v for k, v in data["mteb"].items()}
    if task_name.lower() in table:
        return table[task_name.lower()]
    for prefix, instruction in data.get("mteb_prefixes", {}).items():
        if task_name.lower().startswith(prefix.lower()):
            return instruction
    return data.get("mteb_task_types", {}).get(task_type) if task_type else None
