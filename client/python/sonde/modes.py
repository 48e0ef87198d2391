"""Training phases, numbered as smdebug's ModeKeys (and the wire's Mode enum)."""

import enum


class ModeKeys(enum.IntEnum):
    TRAIN = 1
    EVAL = 2
    PREDICT = 3
    GLOBAL = 4


TRAIN = ModeKeys.TRAIN
EVAL = ModeKeys.EVAL
PREDICT = ModeKeys.PREDICT
GLOBAL = ModeKeys.GLOBAL
