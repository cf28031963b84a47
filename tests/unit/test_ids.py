"""Task ids (``ids.py``): UUIDv7 made without uuid_utils' slow standard-library wrapper."""

from __future__ import annotations

import uuid

from taskmesh.ids import uuid7, uuid7_text


def test_an_id_is_a_standard_library_uuid_of_version_7() -> None:
    made = uuid7()
    assert type(made) is uuid.UUID
    assert made.version == 7
    assert made == uuid.UUID(str(made))
    assert made.is_safe is uuid.SafeUUID.unknown


def test_the_text_is_the_ids_own() -> None:
    given, text = uuid7_text()
    assert type(given) is uuid.UUID
    assert str(given) == text
    assert uuid.UUID(text) == given and given.version == 7


def test_ids_made_one_after_another_sort_in_the_order_made() -> None:
    made = [uuid7() if i % 2 else uuid7_text()[0] for i in range(2000)]
    assert made == sorted(made)
    assert len(set(made)) == 2000
