"""Deterministic synthetic memories for ``engram bench scale``.

Sentences are filled from varied templates (plans, family, health, work, food, pets,
hobbies, assistant replies, extracted facts) and a shared vocabulary, so stores of any
size have realistic lengths, repetitions and near-duplicates. Memory ``i`` is the same
for every size (a smaller store is a prefix of a larger one), and its tenant, user and
conversation come from a fixed layout: tenants uniformly, conversations within a
tenant Zipf-skewed (a few long conversations, many short ones), as in real use.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

PEOPLE = [
    "Anna", "Ben", "Carla", "Dmitri", "Elif", "Farah", "Gustavo", "Hana", "Ivan", "Jonas",
    "Keiko", "Liam", "Maya", "Nadia", "Omar", "Priya", "Quentin", "Rosa", "Sven", "Tariq",
]  # fmt: skip
RELATIVES = [
    "sister", "brother", "mother", "father", "cousin", "grandmother", "uncle", "aunt",
    "daughter", "son", "wife", "husband", "best friend", "neighbour", "flatmate",
]  # fmt: skip
PLACES = [
    "Lisbon", "Kyoto", "Oslo", "Marrakesh", "Vancouver", "Porto", "Reykjavik", "Hanoi",
    "Cape Town", "Valencia", "Edinburgh", "Buenos Aires", "Tallinn", "Seoul", "Bologna",
    "the Dolomites", "the Lake District", "Crete", "Patagonia", "the Scottish Highlands",
]  # fmt: skip
FOODS = [
    "peanuts", "shellfish", "ramen", "sourdough bread", "dark chocolate", "falafel",
    "mushroom risotto", "spicy tofu", "lemon tart", "oat milk", "paella", "dumplings",
    "blue cheese", "kimchi", "green curry", "tiramisu", "gluten", "avocado toast",
]  # fmt: skip
ACTIVITIES = [
    "rock climbing", "learning Portuguese", "running half marathons", "playing the cello",
    "pottery", "bouldering", "baking bread", "birdwatching", "salsa dancing", "sea kayaking",
    "chess", "woodworking", "yoga", "film photography", "gardening", "trail running",
    "painting watercolours", "learning Japanese", "cycling to work", "open-water swimming",
]  # fmt: skip
JOBS = [
    "nurse", "software engineer", "architect", "primary school teacher", "data analyst",
    "chef", "physiotherapist", "lawyer", "graphic designer", "electrician", "pharmacist",
    "journalist", "accountant", "veterinarian", "product manager", "translator",
]  # fmt: skip
PETS = ["dog", "cat", "rabbit", "parrot", "tortoise", "hamster", "border collie", "kitten"]
PET_NAMES = [
    "Biscuit", "Pepper", "Mochi", "Luna", "Otis", "Nala", "Ziggy", "Maple", "Pixel", "Bruno",
]  # fmt: skip
MONTHS = [
    "January", "February", "March", "April", "May", "June", "July", "August", "September",
    "October", "November", "December",
]  # fmt: skip
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
AGO = [
    "last week", "two months ago", "last spring", "a few days ago", "in 2023", "last year",
    "over the summer", "three weeks ago", "recently", "at the start of the year",
]  # fmt: skip
PROJECTS = [
    "the billing migration", "the Q3 roadmap", "the onboarding redesign", "the data warehouse",
    "the mobile release", "the security audit", "the customer survey", "the hiring plan",
]  # fmt: skip
ITEMS = [
    "a new rain jacket", "concert tickets", "a birthday present", "hiking boots",
    "a standing desk", "train tickets", "a cast-iron pan", "running shoes", "a tent",
    "a coffee grinder", "noise-cancelling headphones", "a bike lock",
]  # fmt: skip
SYMPTOMS = ["migraines", "a sore knee", "back pain", "hay fever", "insomnia", "a sprained ankle"]
TOPICS = [
    "Roman history", "climate science", "behavioural economics", "space exploration",
    "urban planning", "mycology", "jazz", "the history of maps", "ancient Greece",
]  # fmt: skip

USER_TEMPLATES = [
    "My {rel} {person} and I are planning a trip to {place} in {month}.",
    "I started {activity} {ago} and I'm honestly hooked.",
    "My {rel} {person} just got a job as a {job} in {place}.",
    "Remind me to buy {item} before {day}.",
    "I can't eat {food}, I'm allergic to it.",
    "We adopted a {pet} called {pet_name} {ago}.",
    "The meeting about {project} moved to {day} at {hour} o'clock.",
    "I've been reading a lot about {topic} lately.",
    "My favourite place in {place} does amazing {food}.",
    "I work as a {job} and my shift starts at {hour} on {day}s.",
    "I've had {symptom} since {ago}, the doctor says to rest.",
    "Can you help me plan a weekend of {activity} near {place}?",
    "{person} recommended a restaurant in {place} that serves {food}.",
    "I'm trying to cut down on {food} this month.",
    "My {rel}'s birthday is on the {date} of {month}; I want to get {item}.",
    "I moved to {place} {ago} for work.",
    "I keep forgetting to water the plants when I'm away on {day}s.",
    "{pet_name} the {pet} has a vet appointment on {day}.",
    "I'd love to learn more about {topic} before the trip to {place}.",
    "I ran my first 10k {ago} and want to try {activity} next.",
    "Our team is behind on {project}, I'm worried about the {month} deadline.",
    "I usually have {food} for lunch when I work from home.",
]
ASSISTANT_TEMPLATES = [
    "That sounds lovely! {place} in {month} is a great choice.",
    "Noted: you're allergic to {food}. I'll keep that in mind for recipes.",
    "Congratulations to {person}! Being a {job} in {place} is a big step.",
    "Here's a simple plan for {activity}: start slow, twice a week, and track progress.",
    "I'll remind you about {item} before {day}.",
    "{pet_name} is a great name for a {pet}.",
    "For {symptom}, rest and gentle stretching usually help; see a doctor if it persists.",
    "A good introduction to {topic} is a short overview before the detailed books.",
    "Good luck with {project}! Breaking it into weekly milestones may help.",
]
FACT_TEMPLATES = [
    "User is allergic to {food}.",
    "User's {rel} is called {person}.",
    "User works as a {job}.",
    "User lives in {place}.",
    "User enjoys {activity}.",
    "User has a {pet} named {pet_name}.",
    "User is planning a trip to {place} in {month}.",
    "User is interested in {topic}.",
    "User's {rel} {person} works as a {job}.",
]
QUERY_TEMPLATES = [
    "Where am I travelling in {month}?",
    "What am I allergic to?",
    "What does my {rel} do for work?",
    "What's my {pet}'s name?",
    "When is the meeting about {project}?",
    "Which hobbies have I picked up recently?",
    "What should I buy before {day}?",
    "Where do I live now?",
    "What restaurant did {person} recommend?",
    "How is my {symptom} doing?",
    "What do I usually eat for lunch?",
    "What was I reading about {topic}?",
    "Who is {person}?",
    "Any plans for {activity} near {place}?",
]

SLOTS = {
    "person": PEOPLE,
    "rel": RELATIVES,
    "place": PLACES,
    "food": FOODS,
    "activity": ACTIVITIES,
    "job": JOBS,
    "pet": PETS,
    "pet_name": PET_NAMES,
    "month": MONTHS,
    "day": DAYS,
    "ago": AGO,
    "project": PROJECTS,
    "item": ITEMS,
    "symptom": SYMPTOMS,
    "topic": TOPICS,
    "hour": [str(h) for h in range(7, 20)],
    "date": ["1st", "3rd", "9th", "12th", "17th", "21st", "28th"],
}

START = datetime(2025, 1, 1, tzinfo=UTC)


def fill(template: str, rng: random.Random) -> str:
    values = {name: rng.choice(words) for name, words in SLOTS.items() if f"{{{name}}}" in template}
    text = template.format(**values)
    return text[0].upper() + text[1:]


@dataclass(frozen=True)
class Layout:
    """How memories spread over tenants, users and conversations."""

    tenants: int = 20
    conversations: int = 50  # per tenant
    users: int = 5  # per tenant; conversation c belongs to user c % users
    zipf_s: float = 1.0

    def weights(self) -> list[float]:
        return [1.0 / (rank + 1) ** self.zipf_s for rank in range(self.conversations)]


@dataclass(frozen=True)
class SyntheticMemory:
    tenant: str
    user_id: str
    conversation_id: str
    kind: str  # "turn" or "fact"
    role: str
    text: str
    source_id: str
    created_at: datetime


def memories(n: int, layout: Layout = Layout(), seed: int = 7) -> list[SyntheticMemory]:
    """The first ``n`` memories of the corpus (deterministic for a seed)."""
    rng = random.Random(seed)
    weights = layout.weights()
    conversations = list(range(layout.conversations))
    turn_of: dict[tuple[int, int], int] = {}
    out = []
    for i in range(n):
        t = i % layout.tenants
        c = rng.choices(conversations, weights)[0]
        turn = turn_of.get((t, c), 0)
        turn_of[(t, c)] = turn + 1
        if rng.random() < 0.15:
            kind, role, text = "fact", "", fill(rng.choice(FACT_TEMPLATES), rng)
        elif turn % 2 == 0:
            kind, role, text = "turn", "user", fill(rng.choice(USER_TEMPLATES), rng)
        else:
            kind, role, text = "turn", "assistant", fill(rng.choice(ASSISTANT_TEMPLATES), rng)
        out.append(
            SyntheticMemory(
                tenant=f"tenant-{t:02d}",
                user_id=f"user-{t:02d}-{c % layout.users}",
                conversation_id=f"conv-{c:02d}",
                kind=kind,
                role=role,
                text=text,
                source_id=f"scale-{i}",
                created_at=START + timedelta(minutes=7 * i),
            )
        )
    return out


def queries(stored: list[SyntheticMemory], n: int, seed: int = 11) -> list[tuple[str, ...]]:
    """``n`` (tenant, user_id, conversation_id, question) picked where memories are, so
    long conversations are asked about more often, as they are in use."""
    rng = random.Random(seed)
    out: list[tuple[str, ...]] = []
    for _ in range(n):
        m = rng.choice(stored)
        out.append((m.tenant, m.user_id, m.conversation_id, fill(rng.choice(QUERY_TEMPLATES), rng)))
    return out
