"""A bundled, deterministic sample sales database for the ``sql_query`` tool.

The data is generated (not shipped as a binary) from a fixed seed, so every build of
the file holds exactly the same rows and tests can rely on concrete answers.
"""

from __future__ import annotations

import calendar
import contextlib
import os
import random
import sqlite3
import tempfile
from pathlib import Path

from django.conf import settings

# Bump whenever the generator changes, so that an existing file built by an older
# version is rebuilt instead of silently serving stale data.
SCHEMA_VERSION = 1
SEED = 20240101
FIRST_YEAR, LAST_YEAR = 2024, 2027

SCHEMA_SQL = """
CREATE TABLE customers (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    country TEXT NOT NULL,
    region TEXT NOT NULL,
    is_overseas INTEGER NOT NULL CHECK (is_overseas IN (0, 1)),
    segment TEXT NOT NULL
);
CREATE TABLE products (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    category TEXT NOT NULL,
    unit_price REAL NOT NULL
);
CREATE TABLE orders (
    id INTEGER PRIMARY KEY,
    customer_id INTEGER NOT NULL REFERENCES customers(id),
    product_id INTEGER NOT NULL REFERENCES products(id),
    order_date TEXT NOT NULL,
    month TEXT NOT NULL,
    quantity INTEGER NOT NULL,
    amount REAL NOT NULL
);
CREATE INDEX orders_month ON orders(month);
CREATE INDEX orders_customer ON orders(customer_id);
CREATE VIEW monthly_sales AS
    SELECT o.month AS month, c.id AS customer_id, c.name AS customer_name,
           c.is_overseas AS is_overseas, ROUND(SUM(o.amount), 2) AS total
    FROM orders o JOIN customers c ON c.id = o.customer_id
    GROUP BY o.month, c.id;
"""

# (name, region, segment); all in country 'KR'.
DOMESTIC = [
    ("Hanbit Electronics", "Seoul", "Enterprise"),
    ("Mirae Semiconductor", "Seoul", "Enterprise"),
    ("Saerom Logistics", "Seoul", "Mid-market"),
    ("Gangnam Software", "Seoul", "SMB"),
    ("Hanul Telecom", "Seoul", "Enterprise"),
    ("Namsan Foods", "Seoul", "Mid-market"),
    ("Jongno Printing", "Seoul", "SMB"),
    ("Yeouido Finance Systems", "Seoul", "Mid-market"),
    ("Suwon Precision", "Gyeonggi", "Mid-market"),
    ("Pangyo Robotics", "Gyeonggi", "Mid-market"),
    ("Ilsan Medical", "Gyeonggi", "SMB"),
    ("Anyang Chemical", "Gyeonggi", "Mid-market"),
    ("Bucheon Plastics", "Gyeonggi", "SMB"),
    ("Hwaseong Motor Parts", "Gyeonggi", "Enterprise"),
    ("Incheon Port Services", "Incheon", "Public"),
    ("Songdo Biologics", "Incheon", "Enterprise"),
    ("Busan Marine Engineering", "Busan", "Mid-market"),
    ("Haeundae Hotels", "Busan", "SMB"),
    ("Daehan Shipbuilding Supply", "Busan", "Enterprise"),
    ("Nakdong Steel", "Busan", "Mid-market"),
    ("Daegu Textiles", "Daegu", "SMB"),
    ("Dalseo Machinery", "Daegu", "Mid-market"),
    ("Gwangju Optics", "Gwangju", "SMB"),
    ("Mudeung Energy", "Gwangju", "Public"),
    ("Daejeon Research Instruments", "Daejeon", "Public"),
    ("Yuseong Labs", "Daejeon", "SMB"),
    ("Ulsan Petrochem", "Ulsan", "Enterprise"),
    ("Taehwa Auto Components", "Ulsan", "Mid-market"),
    ("Changwon Heavy Industries", "Gyeongnam", "Enterprise"),
    ("Geoje Offshore", "Gyeongnam", "Mid-market"),
    ("Cheongju Display", "Chungbuk", "Mid-market"),
    ("Osong Pharm", "Chungbuk", "SMB"),
    ("Jeonju Agro Foods", "Jeonbuk", "SMB"),
    ("Saemangeum Solar", "Jeonbuk", "Public"),
    ("Chuncheon Data Center", "Gangwon", "Mid-market"),
    ("Gangneung Coffee Roasters", "Gangwon", "SMB"),
    ("Jeju Green Tourism", "Jeju", "SMB"),
    ("Halla Water", "Jeju", "SMB"),
    ("Pohang Steel Works", "Gyeongbuk", "Enterprise"),
    ("Gumi Electronics", "Gyeongbuk", "Mid-market"),
]

# (name, country, region, segment)
OVERSEAS = [
    ("Hanbit America Inc.", "US", "North America", "Subsidiary"),
    ("Mirae Semiconductor USA Inc.", "US", "North America", "Subsidiary"),
    ("Pacific Coast Distribution LLC", "US", "North America", "Distributor"),
    ("Lone Star Devices Inc.", "US", "North America", "Enterprise"),
    ("Hanbit Japan K.K.", "JP", "Asia", "Subsidiary"),
    ("Osaka Precision Co., Ltd.", "JP", "Asia", "Enterprise"),
    ("Tokyo Components K.K.", "JP", "Asia", "Distributor"),
    ("Daehan Europe GmbH", "DE", "Europe", "Subsidiary"),
    ("Rhein Industrietechnik GmbH", "DE", "Europe", "Enterprise"),
    ("Bavaria Autoteile AG", "DE", "Europe", "Enterprise"),
    ("Mirae Vietnam Co., Ltd.", "VN", "Asia", "Subsidiary"),
    ("Saigon Electronics JSC", "VN", "Asia", "Enterprise"),
    ("Hanoi Assembly Co., Ltd.", "VN", "Asia", "Distributor"),
    ("Hanbit (Shanghai) Co., Ltd.", "CN", "Asia", "Subsidiary"),
    ("Shenzhen Bright Components Co.", "CN", "Asia", "Distributor"),
    ("Suzhou Industrial Partners Co.", "CN", "Asia", "Enterprise"),
    ("Arbor Asia Pacific Pte. Ltd.", "SG", "Asia", "Subsidiary"),
    ("Pune Auto Systems Pvt. Ltd.", "IN", "Asia", "Enterprise"),
    ("Monterrey Manufactura S.A. de C.V.", "MX", "Latin America", "Enterprise"),
    ("Wroclaw Assembly Sp. z o.o.", "PL", "Europe", "Subsidiary"),
]

# (name, category, unit_price in KRW, usual min quantity, usual max quantity, popularity weight)
PRODUCTS = [
    ("Power Module PM-200", "Components", 185_000, 5, 60, 10),
    ("Sensor Array SA-10", "Components", 42_000, 10, 200, 12),
    ("Control Board CB-7", "Components", 96_000, 5, 100, 10),
    ("Connector Kit CK-3", "Components", 8_500, 50, 1_000, 12),
    ("OLED Panel 6.1in", "Displays", 68_000, 20, 400, 8),
    ("LCD Panel 15in", "Displays", 120_000, 10, 150, 6),
    ("Battery Cell 21700", "Batteries", 4_200, 200, 5_000, 8),
    ("Battery Pack BP-48", "Batteries", 640_000, 1, 20, 5),
    ("Inspection Camera IC-5", "Equipment", 2_350_000, 1, 4, 3),
    ("Assembly Robot Arm AR-1", "Equipment", 18_500_000, 1, 2, 1),
    ("Maintenance Contract (month)", "Services", 900_000, 1, 3, 5),
    ("Installation Service", "Services", 450_000, 1, 5, 4),
    ("Copper Foil (roll)", "Materials", 310_000, 2, 40, 5),
    ("Specialty Resin (25kg)", "Materials", 155_000, 2, 60, 5),
    ("Factory MES License", "Software", 3_200_000, 1, 2, 2),
]


def default_path() -> Path:
    """The configured database path, read at call time so tests can override it."""
    configured = getattr(settings, "ARBOR_SALES_DB_PATH", None)
    if configured:
        return Path(configured)
    return Path(settings.BASE_DIR) / "var" / "sales.sqlite3"


def ensure_sales_db(path: Path | None = None) -> Path:
    """Build the sample database at ``path`` if it is missing or outdated; return the path."""
    path = Path(path) if path is not None else default_path()
    if _current(path):
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    # Build beside the target and rename: readers never see a half-written file, and two
    # processes racing to build just replace one identical file with another.
    fd, tmp_name = tempfile.mkstemp(prefix=".sales-", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        _build(Path(tmp_name))
        os.replace(tmp_name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise
    return path


def _current(path: Path) -> bool:
    if not path.exists():
        return False
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
            return conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    except sqlite3.DatabaseError:
        return False


def _build(path: Path) -> None:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.executescript(SCHEMA_SQL)
        customers = _customers()
        conn.executemany("INSERT INTO customers VALUES (?, ?, ?, ?, ?, ?)", customers)
        conn.executemany(
            "INSERT INTO products VALUES (?, ?, ?, ?)",
            [(i, name, cat, float(price)) for i, (name, cat, price, *_) in enumerate(PRODUCTS, 1)],
        )
        conn.executemany("INSERT INTO orders VALUES (?, ?, ?, ?, ?, ?, ?)", _orders(customers))
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        conn.commit()


def _customers() -> list[tuple]:
    rows = [(name, "KR", region, 0, segment) for name, region, segment in DOMESTIC]
    rows += [(name, country, region, 1, segment) for name, country, region, segment in OVERSEAS]
    return [(i, *row) for i, row in enumerate(rows, 1)]


def _orders(customers: list[tuple]) -> list[tuple]:
    rng = random.Random(SEED)
    domestic = [c[0] for c in customers if not c[4]]
    overseas = [c[0] for c in customers if c[4]]
    # Fixed per-customer sizes give a stable "big customer" ranking with month-to-month noise.
    size = {cid: rng.uniform(0.3, 3.0) for cid in domestic + overseas}
    product_weights = [p[5] for p in PRODUCTS]

    def order(cid: int, year: int, month: int, bulk: float) -> tuple:
        pid = rng.choices(range(1, len(PRODUCTS) + 1), weights=product_weights)[0]
        _, _, price, qmin, qmax, _ = PRODUCTS[pid - 1]
        quantity = max(1, round(rng.randint(qmin, qmax) * bulk))
        discount = 0.1 if quantity >= 10 * qmin and bulk > 1 else 0.0  # volume discount
        day = rng.randint(1, calendar.monthrange(year, month)[1])
        return (
            cid,
            pid,
            f"{year:04d}-{month:02d}-{day:02d}",
            f"{year:04d}-{month:02d}",
            quantity,
            round(quantity * price * (1 - discount), 2),
        )

    rows: list[tuple] = []
    for year in range(FIRST_YEAR, LAST_YEAR + 1):
        for month in range(1, 13):
            growth = 1 + 0.08 * (year - FIRST_YEAR)
            month_rows = [
                order(cid, year, month, growth)
                for cid in rng.choices(domestic, weights=[size[c] for c in domestic], k=rng.randint(50, 65))
            ]
            month_rows += [
                order(cid, year, month, growth)
                for cid in rng.choices(overseas, weights=[size[c] for c in overseas], k=rng.randint(6, 10))
            ]
            # Overseas subsidiaries and distributors restock in bulk, heaviest at quarter end,
            # so they regularly rank among the biggest customers of a month.
            quarter_end = month % 3 == 0
            stockers = rng.sample(overseas, 3 if quarter_end else 1)
            bulk = (3, 6) if quarter_end else (2, 4)
            month_rows += [
                order(cid, year, month, growth * rng.uniform(*bulk)) for cid in stockers for _ in range(2)
            ]
            month_rows.sort(key=lambda r: (r[2], r[0], r[1]))
            rows += month_rows
    return [(i, *row) for i, row in enumerate(rows, 1)]
