import gc

from banditspec.serving.heap import freeze_heap


def test_freeze_heap_collects_then_freezes_what_is_alive():
    class Cycle:
        pass

    gc.disable()  # no collection but freeze_heap's
    try:
        garbage = Cycle()
        garbage.me = garbage  # a cycle only a collection frees
        del garbage
        kept = Cycle()
        frozen = freeze_heap()
        # A frozen object that another thread (a leftover server thread of an earlier test) releases leaves the
        # permanent generation, so the count can only shrink after the freeze, never grow while gc is disabled.
        assert frozen >= gc.get_freeze_count() > 0.99 * frozen
        assert sum(type(o) is Cycle for o in gc.get_objects()) == 0  # frozen objects are out of the collector's lists
    finally:
        gc.unfreeze()
        gc.enable()
    assert gc.get_freeze_count() == 0
    alive = [o for o in gc.get_objects() if type(o) is Cycle]
    assert alive == [kept]  # the cycle was collected, not frozen

