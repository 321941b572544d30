"""Conversation JSONL: every accepted shape and every bad-input class."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eaglewire.data.formats import read_conversations
from eaglewire.errors import DataFormatError


def write_lines(path: Path, lines: list[str | bytes]) -> Path:
    with open(path, "wb") as f:
        for line in lines:
            f.write((line if isinstance(line, bytes) else line.encode("utf-8")) + b"\n")
    return path


def row(obj: object) -> str:
    return json.dumps(obj)


def test_all_three_shapes_and_ids(tmp_path: Path) -> None:
    p = write_lines(
        tmp_path / "mix.jsonl",
        [
            row(
                {
                    "id": "a",
                    "messages": [
                        {"role": "system", "content": "be nice"},
                        {"role": "user", "content": "hi"},
                        {"role": "assistant", "content": "hello"},
                    ],
                }
            ),
            row({"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]}),
            row({"prompt": "write a poem", "system": "you are a poet"}),
            "",
            row(
                {
                    "id": 7,
                    "messages": [
                        {
                            "role": "user",
                            "content": [{"type": "text", "text": "multi"}, {"type": "text", "text": "part"}],
                        }
                    ],
                }
            ),
        ],
    )
    convs, stats = read_conversations(p)
    assert [c.record_id for c in convs] == ["a", "mix.jsonl:2", "mix.jsonl:3", "7"]
    assert [m.role for m in convs[0].messages] == ["system", "user", "assistant"]
    assert [(m.role, m.content) for m in convs[1].messages] == [("user", "q"), ("assistant", "a")]
    assert [(m.role, m.content) for m in convs[2].messages] == [
        ("system", "you are a poet"),
        ("user", "write a poem"),
    ]
    assert convs[3].messages[0].content == "multipart"
    assert stats.blank_lines == 1 and stats.records == 4


def test_malformed_json_names_file_and_line(tmp_path: Path) -> None:
    p = write_lines(
        tmp_path / "bad.jsonl", [row({"prompt": "ok"}), '{"prompt": "broken"', row({"prompt": "ok2"})]
    )
    with pytest.raises(DataFormatError, match=r"bad\.jsonl:2: invalid JSON"):
        read_conversations(p)
    convs, stats = read_conversations(p, skip_bad=True)
    assert [c.messages[0].content for c in convs] == ["ok", "ok2"]
    assert stats.skipped_malformed == 1 and "bad.jsonl:2" in stats.skipped_examples[0]


def test_unknown_role_is_named(tmp_path: Path) -> None:
    p = write_lines(tmp_path / "roles.jsonl", [row({"conversations": [{"from": "narrator", "value": "x"}]})])
    with pytest.raises(DataFormatError, match=r"roles\.jsonl:1: conversations\[0\]: unknown role 'narrator'"):
        read_conversations(p)
    _, stats = read_conversations(p, skip_bad=True)
    assert stats.skipped_malformed == 1


def test_invalid_utf8_is_named(tmp_path: Path) -> None:
    good = row({"prompt": "fine"})
    p = write_lines(tmp_path / "enc.jsonl", [good, b'{"prompt": "caf\xe9"}'])
    with pytest.raises(DataFormatError, match=r"enc\.jsonl:2: invalid UTF-8 at byte 15"):
        read_conversations(p)
    convs, stats = read_conversations(p, skip_bad=True)
    assert len(convs) == 1 and stats.skipped_malformed == 1


def test_unknown_shape_and_non_object(tmp_path: Path) -> None:
    p = write_lines(tmp_path / "shape.jsonl", [row({"text": "hi"})])
    with pytest.raises(DataFormatError, match=r"shape\.jsonl:1: row has none of 'messages'"):
        read_conversations(p)
    p2 = write_lines(tmp_path / "list.jsonl", [row(["not", "an", "object"])])
    with pytest.raises(DataFormatError, match=r"list\.jsonl:1: expected a JSON object"):
        read_conversations(p2)
    p3 = write_lines(tmp_path / "msg.jsonl", [row({"messages": [{"content": "no role"}]})])
    with pytest.raises(DataFormatError, match=r"msg\.jsonl:1: messages\[0\]: missing 'role'"):
        read_conversations(p3)


def test_empty_and_assistantless_are_skipped_and_counted(tmp_path: Path) -> None:
    p = write_lines(
        tmp_path / "e.jsonl",
        [
            row({"messages": []}),
            row({"messages": [{"role": "system", "content": "only system"}]}),
            row({"messages": [{"role": "user", "content": "   "}, {"role": "assistant", "content": ""}]}),
            row({"messages": [{"role": "user", "content": "no answer"}]}),
            row({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}),
        ],
    )
    convs, stats = read_conversations(p, require_assistant=True)
    assert len(convs) == 1 and stats.skipped_empty == 3 and stats.skipped_no_assistant == 1
    convs, stats = read_conversations(p, require_assistant=False)
    assert len(convs) == 2 and stats.skipped_no_assistant == 0


def test_duplicate_ids_are_an_error(tmp_path: Path) -> None:
    p = write_lines(tmp_path / "d.jsonl", [row({"id": "x", "prompt": "a"}), row({"id": "x", "prompt": "b"})])
    with pytest.raises(DataFormatError, match=r"d\.jsonl:2: duplicate id 'x' \(first at line 1\)"):
        read_conversations(p)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DataFormatError, match="no such file"):
        read_conversations(tmp_path / "nope.jsonl")


def test_a_bom_opening_the_file_is_accepted(tmp_path: Path) -> None:
    """Editors on Windows write one; it is not part of the first row."""
    ok = row({"prompt": "hi"})
    convs, stats = read_conversations(
        write_lines(tmp_path / "bom.jsonl", [b"\xef\xbb\xbf" + ok.encode(), ok])
    )
    assert [c.messages[0].content for c in convs] == ["hi", "hi"] and stats.records == 2


def test_a_bom_inside_the_file_is_named(tmp_path: Path) -> None:
    ok = row({"prompt": "hi"})
    path = write_lines(tmp_path / "cat.jsonl", [ok, b"\xef\xbb\xbf" + ok.encode()])
    with pytest.raises(
        DataFormatError, match=r"cat\.jsonl:2: the line starts with a UTF-8 byte-order mark"
    ) as e:
        read_conversations(path)
    assert "remove the 3 bytes EF BB BF" in str(e.value)
    _, stats = read_conversations(path, skip_bad=True)
    assert stats.skipped_malformed == 1


@pytest.mark.parametrize(
    "message",
    [{"role": "user", "content": None}, {"role": "user"}, {"from": "human", "value": None}],
)
def test_a_null_content_is_refused_naming_the_line_and_message(tmp_path: Path, message: dict) -> None:
    """Dropping it would silently make another conversation (here: an answer without its question)."""
    key, answer = (
        ("conversations", {"from": "gpt", "value": "a"})
        if "from" in message
        else (
            "messages",
            {"role": "assistant", "content": "a"},
        )
    )
    ok = row({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]})
    path = write_lines(tmp_path / "null.jsonl", [ok, row({key: [message, answer]})])
    with pytest.raises(
        DataFormatError, match=rf"null\.jsonl:2: {key}\[0\] \(user\)\.\w+: the message has no content"
    ):
        read_conversations(path)
    convs, stats = read_conversations(path, skip_bad=True)
    assert len(convs) == 1 and stats.skipped_malformed == 1


def test_messages_without_text_are_dropped_and_counted(tmp_path: Path) -> None:
    path = write_lines(
        tmp_path / "e.jsonl",
        [row({"messages": [{"role": "system", "content": ""}, {"role": "user", "content": "q"},
                           {"role": "assistant", "content": "a"}, {"role": "user", "content": "  "}]})],
    )  # fmt: skip
    convs, stats = read_conversations(path)
    assert [m.role for m in convs[0].messages] == ["user", "assistant"]
    assert stats.dropped_empty_messages == 2 and stats.to_json()["dropped_empty_messages"] == 2
