"""The built-in prompts the target answers when the completions log holds too few samples.

Chat questions of the kinds an assistant gets (open questions, explanations,
advice, lists, short writing, code), built from templates and topics so about
three thousand differ. The benchmark's own prompts (bench/workloads.py) are not among
them: the benchmark measures a head on text it was not trained on.
"""
from __future__ import annotations

import itertools
import random

TEMPLATES = (
    "Why do people enjoy {t}? Give a few reasons.",
    "Explain {t} to a complete beginner.",
    "What are the pros and cons of {t}?",
    "Give me five practical tips about {t}.",
    "Write a short story about {t}.",
    "What is the history of {t}, in a few paragraphs?",
    "How would you teach a child about {t}?",
    "What are common mistakes people make with {t}?",
    "Write a short poem about {t}.",
    "Summarize the main ideas behind {t}.",
    "What should I know before getting started with {t}?",
    "Describe a typical day for someone who works with {t}.",
    "Compare {t} with something similar and explain the differences.",
    "What questions should I ask an expert about {t}?",
    "Write an encouraging message to a friend who is struggling with {t}.",
    "What does a beginner need to buy for {t}, and what can wait?",
    "Write a short blog post introduction about {t}.",
    "How has {t} changed over the last twenty years?",
    "What are three myths about {t}, and what is actually true?",
    "Plan a weekend around {t} for a family with two children.",
    "Explain the science behind {t} in simple terms.",
    "Write a dialogue between two friends discussing {t}.",
    "What are the health or wellbeing effects of {t}?",
    "How can someone with little free time still enjoy {t}?",
    "Give a step-by-step plan for the first month of {t}.",
)

TOPICS = (
    "gardening", "learning a new language", "cooking at home", "running a marathon", "saving money",
    "photography", "birdwatching", "public speaking", "remote work", "playing chess", "baking bread",
    "camping in the mountains", "reading novels", "learning to swim", "keeping a journal", "city cycling",
    "volunteering", "learning the piano", "travelling by train", "raising a puppy", "meditation",
    "writing a resume", "moving to a new city", "painting with watercolours", "recycling", "drinking tea",
    "building a treehouse", "studying for exams", "solar energy", "visiting museums", "knitting",
    "team sports", "sleeping well", "time management", "learning to code", "board games", "fishing",
    "growing tomatoes", "the night sky", "cleaning the house", "rock climbing", "learning to draw",
    "making pottery", "home brewing coffee", "scuba diving", "keeping bees", "writing poetry", "yoga",
    "composting", "learning history", "playing the guitar", "origami", "hiking with a dog", "ice skating",
    "starting a small business", "making friends as an adult", "bird feeders", "learning statistics",
    "repairing a bicycle", "sailing",
    "learning to dance", "woodworking", "keeping houseplants alive", "running a book club", "learning sign language",
    "train spotting", "making cheese", "skiing", "electric cars", "planning a wedding", "learning to juggle",
    "collecting stamps", "bird photography", "minimalism", "renting a first flat", "cold water swimming",
    "learning calligraphy", "making jam", "amateur astronomy", "community gardens", "learning to sew",
    "playing the violin", "caring for an elderly parent", "surfing", "making pasta from scratch",
    "foraging for mushrooms", "building a personal website", "learning to sail a dinghy", "trail running",
    "caring for chickens", "improv theatre", "learning to budget", "mountain biking", "keeping an aquarium",
    "learning chemistry", "archery", "reading poetry aloud", "beekeeping in a city", "restoring old furniture",
    "learning to type fast", "tabletop role-playing games", "wild camping", "kayaking", "learning to bake cakes",
    "making candles", "cross-country skiing", "podcasting", "learning geography", "growing herbs indoors",
    "martial arts", "wine tasting", "making a family tree", "learning to knit socks", "going to the opera",
    "speed reading", "bird migration",
)

CODE_TASKS = (
    "Write a Python function that returns the n-th Fibonacci number.",
    "Write a Python function that checks whether a string is a palindrome.",
    "Write a Python class for a simple bank account with deposit and withdraw methods.",
    "Write a Python function that counts the words in a text file.",
    "Write a Python function that merges two sorted lists into one sorted list.",
    "Write a JavaScript function that removes duplicates from an array.",
    "Write a SQL query that finds the ten customers who spent the most.",
    "Write a Python function that converts Celsius to Fahrenheit, with a docstring.",
    "Explain what a Python list comprehension is, with examples.",
    "Write a Python script that prints a multiplication table from 1 to 10.",
)


def builtin_prompts(n: int, seed: int = 0) -> list[str]:
    """n user messages (repeating past the set's size), shuffled reproducibly."""
    everything = [tpl.format(t=topic) for tpl, topic in itertools.product(TEMPLATES, TOPICS)] + list(CODE_TASKS)
    random.Random(seed).shuffle(everything)
    return [everything[i % len(everything)] for i in range(n)]
