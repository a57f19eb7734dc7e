"""Names suggested from introductions (issue 27.5): a test per pattern and per false friend.

The rule only ever makes a suggestion (a person confirms it); these tests pin which words make
one, so that "I'm sure" never asks the room whether Speaker B is called Sure.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from voice.introductions import name_from_introduction


@pytest.mark.parametrize(
    ("text", "name"),
    [
        # I'm NAME / I am NAME
        ("Hi, I'm Ian.", "Ian"),
        ("Hi everyone I'm Ian and I run the platform team.", "Ian"),
        ("Good morning all, I am Peggy.", "Peggy"),
        ("Sorry I'm late. I'm Jean-Luc, from the Paris office.", "Jean-Luc"),
        ("Yeah, I’m Siobhan O'Brien.", "Siobhan O'Brien"),
        ("I'm Zoë.", "Zoë"),
        # my name is NAME / my name's NAME / call me NAME
        ("Hello, my name is Ian Smith and I'll be taking notes.", "Ian Smith"),
        ("My name's Peggy.", "Peggy"),
        ("Everyone calls me Bob, so call me Bob.", "Bob"),
        # this is NAME at the opening
        ("This is Peggy from finance.", "Peggy"),
        ("Hello, this is Peggy from finance.", "Peggy"),
        ("Hi all, this is Ian", "Ian"),
        # NAME here / it's NAME here at the opening
        ("Ian here.", "Ian"),
        ("Ian here, just joined.", "Ian"),
        ("Hi, Peggy here from finance.", "Peggy"),
        ("Hey, it's Ian here.", "Ian"),
        ("Peggy Lee here.", "Peggy Lee"),
    ],
)
def test_an_introduction_suggests_its_name(text: str, name: str) -> None:
    assert name_from_introduction(text) == name


@pytest.mark.parametrize(
    "text",
    [
        # I'm + a word that is not a name
        "I'm sure we can ship it on Friday.",
        "I'm happy to take that one.",
        "I'm not sure about Ian's numbers.",
        "Honestly I'm Not Sure.",  # title case from an STT
        "I'm Canadian, so no.",
        "I'm OK with that.",  # an acronym-like word
        "I'm going to share my screen.",
        "I am afraid that's all.",
        # my name / call me + not a name
        "Call me tomorrow.",
        "They spelled my name wrong.",
        # this is + not a name, or not at the opening, or someone else introduced
        "This is great.",
        "This is Monday's plan.",
        "So the thing is this is Ian's doc.",  # not the opening
        "This is Peggy, she runs finance.",  # someone else is introduced
        "This is Peggy from finance, she will join later.",
        "This is Peggy Lee, who you met last week.",
        # X here + not a name, or not at the opening
        "Nobody here has the numbers.",
        "Everyone here?",
        "Sign here please.",
        "Click here.",
        "Right here.",
        "We're here.",
        "Everyone's here.",
        "I think Ian here has the numbers.",  # someone speaking of Ian
        "Is Peggy here?",
        # nothing like an introduction
        "",
        "Thank you very much.",
        "ian here",  # lower case all through: the STT gave no capitals to trust
    ],
)
def test_a_false_friend_suggests_nothing(text: str) -> None:
    assert name_from_introduction(text) is None


@given(st.text(max_size=80))
def test_the_name_is_always_words_of_the_turn_and_capitalised(text: str) -> None:
    name = name_from_introduction(text)
    if name is not None:
        assert name in " ".join(text.split())
        assert all(word[0].isupper() for word in name.split())


@given(st.text(max_size=80))
def test_a_turn_in_lower_case_never_suggests_a_name(text: str) -> None:
    assert name_from_introduction(text.lower()) is None
