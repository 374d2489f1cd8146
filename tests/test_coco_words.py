"""The real-world bundle's words and sentences (models/coco_words.py): COCO's names exactly, counts, plurals."""

from __future__ import annotations

from models import coco_words
from models.coco_words import CLASSES, Scene, nouns, phrase, plural, sentence

IDX = coco_words.class_index()


def test_the_80_coco_names_and_their_irregular_plurals():
    assert len(CLASSES) == 80 == len(set(CLASSES))
    assert plural("person") == "people"
    assert plural("bus") == "buses"
    assert plural("wine glass") == "wine glasses"
    assert plural("knife") == "knives"
    assert plural("sheep") == "sheep"
    assert plural("hot dog") == "hot dogs"


def test_counts_and_articles():
    assert phrase("bicycle", 1) == "a bicycle"
    assert phrase("umbrella", 1) == "an umbrella"
    assert phrase("person", 2) == "two people"
    assert phrase("car", 9) == "many cars"
    assert phrase("scissors", 1) == "a pair of scissors" and phrase("skis", 2) == "two pairs of skis"
    assert sentence(Scene(((IDX["skis"], 1),), "up")) == "a pair of skis ; a pair of skis moves up"


def test_a_sentence_names_objects_then_the_main_ones_motion():
    scene = Scene(((IDX["person"], 2), (IDX["bicycle"], 1)), "left")
    assert sentence(scene) == "two people and a bicycle ; a person moves left"
    assert sentence(Scene(((IDX["car"], 1),))) == "a car"
    assert sentence(Scene(())) == coco_words.NOTHING


def test_every_sentence_word_is_in_the_vocabulary():
    vocab = set(coco_words.vocabulary())
    scene = Scene(((IDX["hair drier"], 3), (IDX["wine glass"], 1), (IDX["traffic light"], 7)), "up")
    for text in (sentence(scene), coco_words.NOTHING):
        assert set(text.split()) <= vocab


def test_nouns_reads_singular_and_plural_and_prefers_the_longer_name():
    assert nouns("two people and a bicycle ; a person moves left") == {IDX["person"], IDX["bicycle"]}
    assert nouns("A man eating a hot dog") == {IDX["hot dog"]}
    assert nouns("wine glasses on a dining table") == {IDX["wine glass"], IDX["dining table"]}
    assert nouns("nothing I know") == set()
    assert nouns("a doghouse") == set()  # whole words only
