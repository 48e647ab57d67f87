"""The dashboard's SVG chart function: pure, escaped, scaled to round numbers."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from jobqueue.dashboard.charts import PAD_TOP, Series, nice_ceiling, svg_chart

SVG = "{http://www.w3.org/2000/svg}"


def parse(markup: str) -> ET.Element:
    return ET.fromstring(markup)  # raises on markup that is not well-formed


def texts(root: ET.Element) -> list[str]:
    return [t.text or "" for t in root.iter(f"{SVG}text")]


def test_nice_ceiling_rounds_up_to_one_two_or_five_times_a_power_of_ten() -> None:
    assert [nice_ceiling(v) for v in (0, 0.3, 1, 1.1, 3, 7, 10, 11, 420, 5000)] == [
        1,
        0.5,
        1,
        2,
        5,
        10,
        10,
        20,
        500,
        5000,
    ]


def test_empty_chart_is_well_formed_and_says_no_data() -> None:
    root = parse(svg_chart([Series("due", [])], x_min=0, x_max=10, title="depth"))
    assert "no data yet" in texts(root)
    assert root.find(f"{SVG}polyline") is None


def test_line_chart_puts_the_largest_value_at_the_top_of_a_round_axis() -> None:
    markup = svg_chart([Series("due", [(0, 0), (5, 4), (10, 2)])], x_min=0, x_max=10, title="depth")
    root = parse(markup)
    (line,) = root.iter(f"{SVG}polyline")
    points = [tuple(map(float, p.split(","))) for p in line.attrib["points"].split()]
    assert len(points) == 3
    # The axis tops at 5 (nice ceiling of 4): 4 sits 1/5 below the top, 0 at the bottom.
    ys = [y for _, y in points]
    assert ys[1] < ys[2] < ys[0]
    assert "5" in texts(root) and "2.5" in texts(root)
    assert points[0][0] < points[1][0] < points[2][0]
    assert ys[1] > PAD_TOP


def test_bars_draw_one_rect_per_nonzero_point() -> None:
    pts = [(i + 1.0, float(v)) for i, v in enumerate([0, 3, 0, 7])]
    root = parse(svg_chart([Series("done", pts)], x_min=0, x_max=4, title="t", bars=True))
    bars = [r for r in root.iter(f"{SVG}rect") if r.attrib.get("fill") == "#2563eb"]
    # The legend swatch is one rect of the series colour; the two nonzero points are bars.
    heights = sorted(float(r.attrib["height"]) for r in bars if r.attrib["width"] != "10")
    assert len(heights) == 2 and heights[0] < heights[1]


def test_points_outside_the_x_range_are_dropped() -> None:
    root = parse(svg_chart([Series("s", [(-5, 100), (1, 1), (2, 2)])], x_min=0, x_max=2, title="t"))
    assert "100" not in texts(root)  # the out-of-range value did not stretch the axis
    (line,) = root.iter(f"{SVG}polyline")
    assert len(line.attrib["points"].split()) == 2


def test_a_single_point_is_drawn_as_a_dot() -> None:
    root = parse(svg_chart([Series("s", [(1, 1)])], x_min=0, x_max=2, title="t"))
    assert len(list(root.iter(f"{SVG}circle"))) == 1


def test_titles_labels_and_ids_are_escaped() -> None:
    evil = '<script>alert("x")</script>&'
    markup = svg_chart(
        [Series(evil, [(1, 1)])],
        x_min=0,
        x_max=2,
        title=evil,
        x_labels=[(1, evil)],
        element_id='a"b',
    )
    assert "<script>" not in markup
    root = parse(markup)
    assert texts(root).count(evil) == 3  # title, legend and axis label, as text
    assert root.attrib["id"] == 'a"b'
