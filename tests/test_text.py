"""Incremental detokenisation and stop strings, on hand-made token tables."""
import pytest

from engine.text import IncrementalDetokenizer, StopStringFilter


def test_multibyte_character_split_over_byte_tokens_is_held_back():
    euro = "€".encode()  # three bytes, one token each
    table = (b"a", euro[:1], euro[1:2], euro[2:], "😀".encode())
    detok = IncrementalDetokenizer(table)
    assert detok.push(0) == "a"
    assert detok.push(1) == ""
    assert detok.push(2) == ""
    assert detok.push(3) == "€"
    assert detok.push(4) == "😀"
    assert detok.flush() == ""


def test_unfinished_character_at_end_becomes_replacement_char():
    detok = IncrementalDetokenizer((b"\xe2\x82",))
    assert detok.push(0) == ""
    assert detok.flush() == "\ufffd"


def feed_all(stops, pieces):
    f = StopStringFilter(tuple(stops))
    streamed = [f.feed(p) for p in pieces]
    if not f.stopped:
        streamed.append(f.flush())
    return f, "".join(streamed), streamed


def test_stop_string_split_across_pieces_is_cut_and_never_streamed():
    f, streamed, parts = feed_all(["END"], ["Hello E", "N", "D tail"])
    assert f.stopped and f.text == "Hello " and streamed == "Hello " and f.matched == "END"
    assert all("E" not in p for p in parts)


def test_partial_stop_prefix_is_released_when_it_turns_out_not_to_stop():
    f, streamed, parts = feed_all(["END"], ["Hello E", "NTER"])
    assert not f.stopped and streamed == "Hello ENTER" and parts[0] == "Hello "


def test_earliest_of_several_stop_strings_wins_and_is_the_one_matched():
    f, streamed, _ = feed_all(["cd", "b"], ["ab", "cd"])
    assert f.text == "a" and f.matched == "b"
    f, _, _ = feed_all(["xyz", "xy"], ["a xyz"])  # both at one place: the first listed
    assert f.text == "a " and f.matched == "xyz"


def test_nothing_is_matched_without_a_stop():
    f, streamed, _ = feed_all(["END"], ["Hello E", "NTER"])
    assert f.matched is None


def test_stop_string_inside_one_piece():
    f, streamed, _ = feed_all(["\n\n"], ["one\n\ntwo"])
    assert f.text == "one" and streamed == "one"


@pytest.mark.parametrize("pieces", [["x" * 10], ["a", "b", "c"], [""]])
def test_no_stop_strings_streams_everything_at_once(pieces):
    f = StopStringFilter(())
    assert "".join(f.feed(p) for p in pieces) == "".join(pieces)
