"""An ALFWorld/TextWorld-like household world: pure Python, seeded, deterministic.

8 rooms in the public suite's 4x2 layout, 10 receptacle kinds (3 per room), 30
items, 6 goal templates. Unlike the public suite, every goal drawn is
achievable (its receptacle and its appliance exist somewhere), each step
returns the list of valid actions, and an interactive episode ends (``done``)
when its goal is met or its step budget is spent. The same seed replays the
same episode.
"""

from __future__ import annotations

import collections
import random
from dataclasses import dataclass, field

ROOMS = ["kitchen", "living_room", "bedroom", "bathroom", "garage", "garden", "office", "pantry"]
EXITS = {
    "kitchen": ["living_room", "garage"],
    "living_room": ["kitchen", "bedroom", "garden"],
    "bedroom": ["living_room", "bathroom", "office"],
    "bathroom": ["bedroom", "pantry"],
    "garage": ["kitchen", "garden"],
    "garden": ["garage", "living_room", "office"],
    "office": ["garden", "bedroom", "pantry"],
    "pantry": ["office", "bathroom"],
}
RECEPTACLES = ["fridge", "table", "shelf", "drawer", "cabinet", "sink", "oven", "couch", "desk", "wardrobe"]
ITEMS = [
    "apple",
    "bread",
    "knife",
    "cup",
    "plate",
    "book",
    "lamp",
    "key",
    "phone",
    "wallet",
    "towel",
    "soap",
    "shampoo",
    "scissors",
    "pen",
    "remote",
    "blanket",
    "pillow",
    "shirt",
    "pants",
    "shoes",
    "hammer",
    "screwdriver",
    "rope",
    "bucket",
    "watering_can",
    "seeds",
    "potion",
    "candle",
    "mug",
]
# What each state-changing goal needs, and the verb that does it.
APPLIANCE = {"clean": "sink", "heat": "oven", "cool": "fridge"}
TEMPLATES = ["fetch", "place", "examine", "clean", "heat", "cool"]


@dataclass(frozen=True)
class Goal:
    template: str
    item: str
    receptacle: str | None = None

    def text(self) -> str:
        if self.template == "fetch":
            return f"Find the {self.item} and take it."
        if self.template == "examine":
            return f"Find the {self.item} and examine it."
        if self.template == "place":
            return f"Put the {self.item} on the {self.receptacle}."
        appliance = APPLIANCE[self.template]
        return (
            f"{self.template.capitalize()} the {self.item} with the {appliance}, then put it on the {self.receptacle}."
        )


@dataclass
class World:
    seed: int
    max_steps: int = 50
    stop_on_goal: bool = True  # interactive episodes end at the goal; B7 batches run their full step count
    room: str = ""
    receptacles: dict[str, list[str]] = field(default_factory=dict)
    contents: dict[str, dict[str, list[str]]] = field(default_factory=dict)  # room -> receptacle -> items
    inventory: list[str] = field(default_factory=list)
    visited: set[str] = field(default_factory=set)
    states: dict[str, set[str]] = field(
        default_factory=lambda: collections.defaultdict(set)
    )  # item -> {clean, hot, cold}
    goal: Goal = field(default=Goal("fetch", "apple"))
    steps: int = 0
    reward: float = 0.0
    done: bool = False
    won: bool = False
    rng: random.Random = field(default_factory=random.Random)

    @classmethod
    def new(cls, seed: int, max_steps: int = 50, stop_on_goal: bool = True) -> World:
        rng = random.Random(seed)
        w = cls(seed=seed, max_steps=max_steps, stop_on_goal=stop_on_goal, rng=rng)
        for room in ROOMS:
            w.receptacles[room] = rng.sample(RECEPTACLES, 3)
            w.contents[room] = {r: [] for r in w.receptacles[room]}
        for item in ITEMS:
            room = rng.choice(ROOMS)
            w.contents[room][rng.choice(w.receptacles[room])].append(item)
        w.room = rng.choice(ROOMS)
        w.visited = {w.room}
        w.goal = w._draw_goal(random.Random(seed * 7 + 1))
        return w

    def _draw_goal(self, rng: random.Random) -> Goal:
        present = {r for rs in self.receptacles.values() for r in rs}
        templates = [t for t in TEMPLATES if t not in APPLIANCE or APPLIANCE[t] in present]
        template = rng.choice(templates)
        item = rng.choice(ITEMS)
        if template in ("fetch", "examine"):
            return Goal(template, item)
        targets = sorted(present - {APPLIANCE.get(template, "")}) or sorted(present)
        return Goal(template, item, rng.choice(targets))

    # ---------------------------------------------------------------- queries

    def items_here(self) -> list[str]:
        return [i for r in self.receptacles[self.room] for i in self.contents[self.room][r]]

    def where(self, item: str) -> tuple[str, str] | None:
        for room in ROOMS:
            for recep, items in self.contents[room].items():
                if item in items:
                    return room, recep
        return None

    def valid_actions(self) -> list[str]:
        acts = ["look", "inventory"] + [f"go {r}" for r in EXITS[self.room]]
        acts += [f"take {i}" for i in self.items_here()]
        acts += [f"examine {i}" for i in self.items_here() + self.inventory]
        for item in self.inventory:
            acts += [f"put {item} on {r}" for r in self.receptacles[self.room]]
            for verb, appliance in APPLIANCE.items():
                if appliance in self.receptacles[self.room]:
                    acts.append(f"{verb} {item} with {appliance}")
        return acts

    def render(self) -> str:
        items = self.items_here()
        return "\n".join(
            [
                f"You are in the {self.room}.",
                f"You see receptacles: {', '.join(self.receptacles[self.room])}.",
                f"You see items: {', '.join(items) if items else '(none)'}.",
                f"Exits: {', '.join(EXITS[self.room])}.",
                f"Inventory: {', '.join(self.inventory) if self.inventory else '(empty)'}.",
            ]
        )

    # ---------------------------------------------------------------- step

    def step(self, action: str) -> tuple[str, float, bool, bool]:
        """Apply ``action``; return (feedback, reward, done, valid). Invalid actions cost a step."""
        if self.done:
            return "The episode is over; reset to play again.", 0.0, True, False
        self.steps += 1
        words = action.strip().lower().split()
        reward, feedback, valid = 0.0, "", True
        verb = words[0] if words else ""
        if verb == "look" and len(words) == 1:
            feedback = self.render()
        elif verb == "inventory" and len(words) == 1:
            feedback = f"You carry: {', '.join(self.inventory) if self.inventory else 'nothing'}."
        elif verb == "go" and len(words) == 2 and words[1] in EXITS[self.room]:
            self.room = words[1]
            if self.room not in self.visited:
                self.visited.add(self.room)
                reward += 0.1
            feedback = self.render()
        elif verb == "take" and len(words) == 2 and words[1] in self.items_here():
            item = words[1]
            for items in self.contents[self.room].values():
                if item in items:
                    items.remove(item)
            self.inventory.append(item)
            feedback = f"You take the {item}."
        elif verb == "examine" and len(words) == 2 and words[1] in self.items_here() + self.inventory:
            item = words[1]
            state = ", ".join(sorted(self.states[item])) or "ordinary"
            feedback = f"The {item} looks {state}."
        elif (
            verb == "put"
            and len(words) == 4
            and words[2] == "on"
            and words[1] in self.inventory
            and words[3] in self.receptacles[self.room]
        ):
            item, recep = words[1], words[3]
            self.inventory.remove(item)
            self.contents[self.room][recep].append(item)
            feedback = f"You put the {item} on the {recep}."
        elif (
            len(words) == 4
            and verb in APPLIANCE
            and words[2] == "with"
            and words[3] == APPLIANCE[verb]
            and words[1] in self.inventory
            and APPLIANCE[verb] in self.receptacles[self.room]
        ):
            item = words[1]
            self.states[item].add({"clean": "clean", "heat": "hot", "cool": "cold"}[verb])
            feedback = f"You {verb} the {item} with the {APPLIANCE[verb]}."
        else:
            valid = False
            feedback = "Nothing happens. (That action is not possible here: see valid_actions.)"
        if valid and not self.won and self._goal_met(verb, words):
            self.won = True
            reward += 1.0
            feedback += " You have completed the task!"
        self.reward += reward
        if (self.won and self.stop_on_goal) or self.steps >= self.max_steps:
            self.done = True
        return feedback, reward, self.done, valid

    def _goal_met(self, verb: str, words: list[str]) -> bool:
        g = self.goal
        if g.template == "fetch":
            return verb == "take" and g.item in self.inventory
        if g.template == "examine":
            return verb == "examine" and words[1] == g.item
        if verb != "put" or words[1] != g.item or words[3] != g.receptacle:
            return False
        if g.template == "place":
            return True
        return {"clean": "clean", "heat": "hot", "cool": "cold"}[g.template] in self.states[g.item]


def _bfs_next(start: str, goal_rooms: set[str]) -> str | None:
    if start in goal_rooms:
        return None
    prev: dict[str, str] = {}
    queue = collections.deque([start])
    seen = {start}
    while queue:
        room = queue.popleft()
        for nxt in EXITS[room]:
            if nxt in seen:
                continue
            seen.add(nxt)
            prev[nxt] = room
            if nxt in goal_rooms:
                while prev[nxt] != start:
                    nxt = prev[nxt]
                return nxt
            queue.append(nxt)
    return None


def heuristic_action(w: World) -> str:
    """A scripted agent that knows the map (what B7 replays): find, transform, place."""
    g = w.goal
    if g.item in w.inventory:
        if (
            g.template in APPLIANCE
            and {"clean": "clean", "heat": "hot", "cool": "cold"}[g.template] not in w.states[g.item]
        ):
            appliance = APPLIANCE[g.template]
            if appliance in w.receptacles[w.room]:
                return f"{g.template} {g.item} with {appliance}"
            nxt = _bfs_next(w.room, {r for r in ROOMS if appliance in w.receptacles[r]})
            return f"go {nxt}" if nxt else "look"
        if g.receptacle:
            if g.receptacle in w.receptacles[w.room]:
                return f"put {g.item} on {g.receptacle}"
            nxt = _bfs_next(w.room, {r for r in ROOMS if g.receptacle in w.receptacles[r]})
            return f"go {nxt}" if nxt else "look"
        return f"examine {g.item}" if g.template == "examine" else "look"
    if g.item in w.items_here():
        return f"take {g.item}"
    loc = w.where(g.item)
    if loc is not None:
        nxt = _bfs_next(w.room, {loc[0]})
        if nxt:
            return f"go {nxt}"
    return f"go {w.rng.choice(EXITS[w.room])}"


def play_batch(seed: int, steps: int, batch: int) -> dict[str, object]:
    """B7's unit: ``batch`` episodes of exactly ``steps`` steps under the heuristic agent."""
    total_reward = 0.0
    won = 0
    steps_done = 0
    rooms = 0
    last_inventory: list[str] = []
    for k in range(batch):
        w = World.new(seed * 1_000_003 + k, max_steps=steps, stop_on_goal=False)
        while not w.done:
            w.step(heuristic_action(w))
        steps_done += w.steps
        total_reward += w.reward
        won += w.won
        rooms = max(rooms, len(w.visited))
        last_inventory = list(w.inventory)
    return {
        "episodes": batch,
        "steps_done": steps_done,
        "total_reward": round(total_reward, 4),
        "goals_met": won,
        "rooms_visited": rooms,
        "final_inventory": last_inventory,
    }
