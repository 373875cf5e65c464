"""Hand-written tables of tricky answers for the verifiers (tests/test_verifiers.py).

GSM8K rows are ``(response, label, strict, flexible)``: the scores of PaddleNLP's rule
(``paddlenlp/rl/models/reward_utils.py`` ``extract_solution`` with
``paddlenlp/rl/trainer/reward_trainer.py`` ``compute_score``), worked out by hand from that code
and checked against it once; the first row is the first GSM8K training answer, the format
``llm/alignment/rl/gsm8k_processor.py`` reads.
"""

GSM8K_FIRST = ("Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips altogether "
               "in April and May.\n#### 72")

GSM8K = [
    (GSM8K_FIRST, "72", 1.0, 1.0),
    ("The answer is 72", "72", 0.0, 1.0),  # right number, wrong format: strict 0, flexible 1
    ("#### 72.0", "72", 0.0, 0.0),  # compared as strings
    ("####72", "72", 0.0, 1.0),  # strict needs one space after ####
    ("#### 1,000", "1000", 1.0, 0.0),  # strict drops commas, flexible keeps them
    ("#### -5", "-5", 1.0, 1.0),  # negative
    ("#### $18", "18", 0.0, 1.0),  # '$' is not in the strict pattern
    ("So the answer is 72.", "72", 0.0, 0.0),  # flexible reads '72.' with its period
    ("#### 70\nNo wait.\n#### 72", "72", 1.0, 1.0),  # the last '#### n'
    ("#### 72 apples and 3 pears", "72", 1.0, 0.0),  # flexible: the last number is 3
    ("I do not know.", "72", 0.0, 0.0),  # nothing to read
    ("#### 1e3", "1000", 0.0, 0.0),  # scientific notation is not read
    ("#### 0.5", "0.5", 1.0, 1.0),
    ("#### 72", "Natalia sold 72 clips.\n#### 72", 1.0, 1.0),  # a full solution as the label
    ("The total is -3.5 dollars", "-3.5", 0.0, 1.0),
]

# (response, label, expected) for math_boxed
MATH_BOXED = [
    # units
    (r"\boxed{5\text{ cm}}", "5", 1.0),
    (r"\boxed{5 \text{cm}}", r"5\text{ cm}", 1.0),
    (r"\boxed{10\text{ cm}^2}", "10", 1.0),
    (r"\boxed{12 \mbox{ inches}}", "12", 1.0),
    (r"\boxed{7 dollars}", "7", 1.0),
    (r"\boxed{3\,\mathrm{m}}", "3", 1.0),
    (r"\boxed{2m}", "2", 0.0),  # a bare one-letter word may be a variable: kept
    # fractions, 0.5 vs 1/2
    (r"\boxed{\frac{1}{2}}", "0.5", 1.0),
    (r"\boxed{\dfrac{1}{2}}", r"\frac12", 1.0),
    (r"\boxed{\tfrac{3}{4}}", "0.75", 1.0),
    (r"\boxed{0.5}", "1/2", 1.0),
    (r"\boxed{.5}", r"\frac{1}{2}", 1.0),
    (r"\boxed{\frac{2}{4}}", r"\frac{1}{2}", 1.0),
    (r"\boxed{\frac{1}{3}}", "0.333", 0.0),  # exact values: 0.333 is not one third
    (r"\boxed{\frac{3}{4}}", "0.7", 0.0),
    # thousands separators
    (r"\boxed{1,000}", "1000", 1.0),
    (r"\boxed{1{,}000}", "1000", 1.0),
    (r"\boxed{1,000,000}", "10^6", 1.0),
    (r"\boxed{1,2}", "12", 0.0),  # a list of two numbers, not a thousands separator
    # nested braces
    (r"\boxed{\frac{\sqrt{3}}{2}}", r"\frac{\sqrt3}{2}", 1.0),
    (r"\boxed{\frac{1}{\frac{1}{2}}}", "2", 1.0),
    (r"So the point is \boxed{\left(\frac{1}{2}, 3\right)}.", r"\left( \frac{1}{2}, 3 \right)", 1.0),
    (r"\boxed{\left(\frac{1}{2}, 3\right)}", r"(3, \frac{1}{2})", 0.0),  # order matters
    # wrong format, right number
    ("The answer is 72", "72", 0.0),
    (r"\boxed{72", "72", 0.0),  # braces do not close
    ("**72**", "72", 0.0),
    # negative numbers
    (r"\boxed{-3}", "-3", 1.0),
    (r"\boxed{-\frac{3}{4}}", "-0.75", 1.0),
    (r"\boxed{\frac{-3}{4}}", r"-\frac34", 1.0),
    (r"\boxed{3}", "-3", 0.0),
    # scientific notation
    (r"\boxed{1.5\times 10^{3}}", "1500", 1.0),
    (r"\boxed{1e3}", "1000", 1.0),
    (r"\boxed{1e99999}", "1", 0.0),  # no exact value formed for a huge exponent
    (r"\boxed{2.5 \cdot 10^{-1}}", r"\frac{1}{4}", 1.0),
    # degrees, percent, dollars, spacing commands
    (r"\boxed{90^\circ}", "90", 1.0),
    (r"\boxed{90^{\circ}}", "90°", 1.0),
    (r"\boxed{25\%}", "25", 1.0),
    (r"\boxed{\$18}", "18", 1.0),
    (r"\boxed{\left[1,\!2\right]}", "[1,2]", 1.0),
    # symbolic equivalence (sympy)
    (r"\boxed{2\pi}", r"\pi \cdot 2", 1.0),
    (r"\boxed{x^2+2x+1}", "(x+1)^2", 1.0),
    (r"\boxed{\frac{\sqrt{3}}{2}}", r"\frac{1}{2}\sqrt{3}", 1.0),
    (r"\boxed{x+1}", "x+2", 0.0),
    (r"\boxed{\sqrt{2}}", "1.4142", 0.0),  # close is not equal
    # the last box; equations; labels holding a box; text; \fbox
    (r"First \boxed{3}, then \boxed{4}", "4", 1.0),
    (r"First \boxed{4}, then \boxed{3}", "4", 0.0),
    (r"\boxed{x = 5}", "5", 1.0),
    (r"\boxed{0.5}", r"so the answer is $\boxed{\frac12}$.", 1.0),
    (r"\boxed{\text{Monday}}", "Monday", 1.0),
    (r"\fbox{7}", "7", 1.0),
]
