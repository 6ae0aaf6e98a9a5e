"""A C++ case set as code-contest RL sends it: solutions of small problems, each graded on its test inputs.

A trainer grades one solution on each of its tests with one ``/run_code`` per test (verl's
``sandbox_fusion`` reward, SkyRL): the same source again and again with another stdin. Eight problems, three
tests each, every expected output checked. ``fresh`` makes every request's source new (a comment with a
nonce): each one compiles, as a policy's first attempt at a problem would.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Case:
    problem: str
    source: str
    stdin: str
    expected: str


_HEAD = "#include <bits/stdc++.h>\nusing namespace std;\n"

PROBLEMS: dict[str, tuple[str, list[tuple[str, str]]]] = {
    "sum": (
        'int main(){long long n,s=0,x;cin>>n;while(n--){cin>>x;s+=x;}cout<<s<<"\\n";}',
        [("3\n1 2 3\n", "6"), ("1\n-5\n", "-5"), ("5\n1000000000 1000000000 1000000000 7 -7\n", "3000000000")],
    ),
    "sort": (
        "int main(){int n;cin>>n;vector<int>v(n);for(auto&x:v)cin>>x;sort(v.begin(),v.end());"
        "for(int i=0;i<n;i++)cout<<v[i]<<(i+1<n?' ':'\\n');}",
        [("5\n5 3 1 4 2\n", "1 2 3 4 5"), ("1\n7\n", "7"), ("4\n-1 -3 2 0\n", "-3 -1 0 2")],
    ),
    "gcd": (
        'int main(){long long a,b;cin>>a>>b;cout<<__gcd(a,b)<<"\\n";}',
        [("12 18\n", "6"), ("17 5\n", "1"), ("1000000007 1000000007\n", "1000000007")],
    ),
    "primes": (
        "int main(){int n;cin>>n;vector<bool>c(n+1,false);int k=0;for(int i=2;i<=n;i++){if(!c[i]){k++;"
        'for(long long j=1LL*i*i;j<=n;j+=i)c[j]=true;}}cout<<k<<"\\n";}',
        [("10\n", "4"), ("100\n", "25"), ("1000000\n", "78498")],
    ),
    "reverse": (
        'int main(){string s;getline(cin,s);reverse(s.begin(),s.end());cout<<s<<"\\n";}',
        [("hello\n", "olleh"), ("a\n", "a"), ("racecar level\n", "level racecar")],
    ),
    "fib": (
        "int main(){int n;cin>>n;const long long M=1000000007;long long a=0,b=1;"
        'for(int i=0;i<n;i++){long long t=(a+b)%M;a=b;b=t;}cout<<a<<"\\n";}',
        [("10\n", "55"), ("1\n", "1"), ("1000\n", "517691607")],
    ),
    "grid_bfs": (
        "int main(){int h,w;cin>>h>>w;vector<string>g(h);for(auto&r:g)cin>>r;vector<vector<int>>d(h,vector<int>(w,-1));"
        "queue<pair<int,int>>q;d[0][0]=0;q.push({0,0});int dx[]={1,-1,0,0},dy[]={0,0,1,-1};"
        "while(!q.empty()){auto[x,y]=q.front();q.pop();for(int k=0;k<4;k++){int a=x+dx[k],b=y+dy[k];"
        "if(a>=0&&a<h&&b>=0&&b<w&&g[a][b]=='.'&&d[a][b]<0){d[a][b]=d[x][y]+1;q.push({a,b});}}}"
        'cout<<d[h-1][w-1]<<"\\n";}',
        [("3 3\n...\n.#.\n...\n", "4"), ("2 2\n.#\n#.\n", "-1"), ("1 5\n.....\n", "4")],
    ),
    "matmul": (
        "int main(){int n;cin>>n;vector<vector<long long>>a(n,vector<long long>(n)),c(n,vector<long long>(n,0));"
        "for(auto&r:a)for(auto&x:r)cin>>x;for(int i=0;i<n;i++)for(int k=0;k<n;k++)for(int j=0;j<n;j++)"
        'c[i][j]+=a[i][k]*a[k][j];long long t=0;for(int i=0;i<n;i++)t+=c[i][i];cout<<t<<"\\n";}',
        [("2\n1 2\n3 4\n", "29"), ("1\n5\n", "25"), ("3\n1 0 0\n0 1 0\n0 0 1\n", "3")],
    ),
}


def cases() -> list[Case]:
    return [
        Case(name, _HEAD + body, stdin, expected)
        for name, (body, tests) in PROBLEMS.items()
        for stdin, expected in tests
    ]
